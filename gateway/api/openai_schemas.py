"""The bodies of /v1, OpenAI's chat completions API as far as the gateway serves it, and
OpenAI's error shape, which every error under /v1/ takes so that OpenAI clients show it.

Requests accept any field OpenAI's SDK or a chat app may send (unknown ones are ignored);
the few the gateway reads are typed and bounded, and those it cannot honour are refused by
name (`_refusal` in gateway.api.openai_compat), never silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Discriminator, Field, GetJsonSchemaHandler, Tag
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from gateway.api.schemas import Citation

MODEL_ID = "gateway"  # the one model /v1/models lists: the gateway's own answer pipeline

# HTTP status -> OpenAI's error `type`, which its SDKs and chat apps key on.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


class OpenAIErrorBody(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, authentication_error, ...")
    param: str | None = Field(default=None, description="The request field at fault, if one")
    code: str | None = Field(description="The gateway's error code (as in problem bodies)")


class OpenAIError(BaseModel):
    error: OpenAIErrorBody


def openai_error(
    status: int,
    code: str,
    message: str,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    kind = ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def openai_problem(problem: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    """A problem body (gateway.errors) in OpenAI's shape: same status, code and headers."""
    message = str(problem.get("detail") or problem.get("title") or "error")
    return openai_error(int(problem["status"]), str(problem["code"]), message, headers=headers)


def is_openai_path(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str = Field(max_length=64)
    text: str | None = None


def _content_kind(value: Any) -> str | None:
    return "str" if isinstance(value, str) else "list" if isinstance(value, list) else None


class _PlainUnion:
    """Publishes a tagged union as the plain union it accepts (anyOf, not oneOf): the
    published schema of `content` stays as it was."""

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        published = handler(schema)
        return {"anyOf": published.pop("oneOf"), **published}


# The branch is chosen by what the client sent: as a plain union, a list with a bad part
# was reported against the string branch ("content.str: Input should be a valid string"),
# the first error being the one an error body names.
Content = Annotated[
    Annotated[str, Tag("str")] | Annotated[list[TextPart], Tag("list")],
    Discriminator(
        _content_kind,
        custom_error_type="content_type",
        custom_error_message="Input should be a string or a list of content parts",
    ),
    _PlainUnion,
]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str = Field(max_length=64, description="system, developer, user, assistant or tool")
    content: Content | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        parts = self.content or []
        return "\n".join(p.text for p in parts if p.type == "text" and p.text)


class ChatRequest(BaseModel):
    """`messages` and `model` are read; the rest of OpenAI's parameters are accepted, those
    the gateway cannot honour refused (400 unsupported_parameter), the others ignored."""

    model_config = ConfigDict(extra="allow")
    model: str = Field(max_length=256, description=f'Always "{MODEL_ID}" (GET /v1/models)')
    messages: list[ChatMessage] = Field(
        min_length=1,
        max_length=1000,
        description="The question is the last user message; earlier turns are not searched",
    )
    stream: bool | None = Field(default=False, description="Server-sent chat.completion.chunk")
    n: int | None = Field(default=None, ge=1, le=128, description="Only 1")
    max_tokens: int | None = Field(
        default=None, ge=1, le=2**31, description="Caps the LLM's answer (policy's at most)"
    )
    max_completion_tokens: int | None = Field(
        default=None, ge=1, le=2**31, description="As max_tokens"
    )
    temperature: float | None = Field(default=None, ge=0, le=2, description="The LLM's")
    tools: list[Any] | None = Field(default=None, description="Refused when not empty")
    functions: list[Any] | None = Field(default=None, description="Refused when not empty")
    tool_choice: Any = Field(default=None, description="Only none or auto (no tools)")
    response_format: dict[str, Any] | None = Field(default=None, description='Only "text"')
    logprobs: bool | None = Field(default=None, description="Refused when true")
    modalities: list[str] | None = Field(default=None, description='Only "text"')
    audio: dict[str, Any] | None = Field(default=None, description="Refused")


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str = Field(description="The answer with [n] markers, or why it abstained")


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop", "length"] = Field(
        default="stop", description='"length" when the answer was cut at its token limit'
    )
    logprobs: None = None


class GatewayBlock(BaseModel):
    """What /answer says beside its text, for clients that look."""

    abstained: bool
    abstain_reason: str | None
    trace_id: str
    policy_version: str
    index_generation: int
    degraded: list[str]


class ChatCompletion(BaseModel):
    id: str = Field(description="chatcmpl-<trace ID>")
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str = MODEL_ID
    choices: list[Choice]
    usage: None = None
    citations: list[Citation] = Field(description="What the [n] markers cite, as in /answer")
    gateway: GatewayBlock


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionChunk(BaseModel):
    """One event of a streamed completion; the last before `[DONE]` has `citations` and
    `gateway`."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str = MODEL_ID
    choices: list[ChunkChoice]
    citations: list[Citation] | None = None
    gateway: GatewayBlock | None = None


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "rag-gateway"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]
