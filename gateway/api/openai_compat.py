"""/v1: an OpenAI-compatible face on /answer, for chat apps and OpenAI's SDKs.

A chat completion is an /answer of the last user message, asked by the same caller through
the same pipeline (gateway.api.calls): the same restriction, audit record, metrics and rate
limits. Earlier turns are not searched, so no turn can widen what is. The answer's text is
the message content; its citations and the rest of /answer ride beside it (`citations`,
`gateway`), where OpenAI's SDKs keep unknown fields.

Streamed, the content is sent once the answer is judged: an LLM's tokens cite evidence by
its own numbers, renumbered (or dropped, or the answer turned into an abstention) only at
the end, and the streamed text must match the citations that close the stream.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, StreamingResponse

from gateway.answer.pipeline import AnswerOutcome, LlmOptions
from gateway.api.calls import AnswerStream, Asker, finish_answer, run_answer, start_answer
from gateway.api.openai_schemas import (
    MODEL_ID,
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatMessage,
    ChatRequest,
    Choice,
    ChunkChoice,
    Delta,
    GatewayBlock,
    Model,
    ModelList,
    OpenAIError,
    openai_error,
)
from gateway.api.schemas import MAX_QUERY_CHARS, AnswerRequest, AnswerResponse
from gateway.api.security import CallerDep, ClockDep, PolicyDep, StateDep, reading_caller
from gateway.api.strict_json import StrictJsonRoute
from gateway.errors import GatewayError
from gateway.telemetry.tracing import Tracing

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": OpenAIError, "description": description}
    for status, description in {
        400: "A parameter the gateway cannot honour, or an invalid request",
        401: "Missing or invalid token",
        403: "An ingest key, or a token lacking claims",
        404: "Not the gateway's model",
        413: "Body over the route's limit",
        429: "Over the caller's request rate",
        503: "No lane answered in time, not ready, or too many answers in progress",
    }.items()
}
log = logging.getLogger("gateway.api")
v1 = APIRouter(
    prefix="/v1",
    dependencies=[Depends(reading_caller)],
    responses=ERRORS,
    route_class=StrictJsonRoute,  # a key given twice is refused
)

TOP_K = AnswerRequest.model_fields["top_k"].default
WORDS_PER_PIECE = 4
# What a chat shows for an abstention: /answer's text is empty then, and a chat app shows
# only the message's content.
ABSTENTIONS = {
    "no_permitted_evidence": "I found nothing in the documents you may read about this.",
    "insufficient_evidence": "The documents you may read do not answer this well enough "
    "for me to say.",
    "ungrounded": "I could not give an answer that your documents support.",
    "model_declined": "The documents you may read do not answer this.",
    "budget_exceeded": "The documents found are too long to answer from within the limits set.",
}
FALLBACK = "I cannot answer this from the documents you may read."


THE_MODEL = Model(id=MODEL_ID, created=0)


@v1.get("/models", response_model=ModelList)
async def models() -> ModelList:
    """The one model: the gateway's answer pipeline (its LLM, if any, is the policy's)."""
    return ModelList(data=[THE_MODEL])


# `:path`: other OpenAI-compatible servers name models `org/name`; asked for here, such
# an ID is not found like any other model (not the plain 404 of an unknown path).
@v1.get("/models/{model:path}", response_model=Model)
async def retrieve_model(model: str) -> Model | JSONResponse:
    """The one model by its ID (the SDKs' `models.retrieve`); any other is not found."""
    return THE_MODEL if model == MODEL_ID else _unknown_model()


def _unknown_model() -> JSONResponse:
    return openai_error(
        404, "model_not_found", f'the only model is "{MODEL_ID}" (GET /v1/models)', "model"
    )


CHAT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A chat.completion; with `stream`, server-sent `data:` lines each "
        "holding a chat.completion.chunk, the last one with `citations` and `gateway`, then "
        "`data: [DONE]`; a failure after the stream began is a `data:` line holding an "
        "OpenAI error body.",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}


@v1.post("/chat/completions", response_model=ChatCompletion, responses=CHAT_RESPONSES)
async def chat_completions(
    body: ChatRequest, caller: CallerDep, policy: PolicyDep, state: StateDep, clock: ClockDep
) -> ChatCompletion | JSONResponse | StreamingResponse:
    refusal = _refusal(body)
    if refusal is not None:
        return refusal
    question = _question(body.messages)
    if question is None:
        return openai_error(
            400,
            "validation_error",
            f"the last user message must hold 1 to {MAX_QUERY_CHARS} characters of text",
            "messages",
        )
    if not _unicode(question):  # /search and /answer refuse it in their schema (422)
        return openai_error(
            400,
            "validation_error",
            "the last user message is not valid Unicode text (a lone surrogate)",
            "messages",
        )
    asker = Asker(state, policy, caller, clock)
    options = LlmOptions(body.max_completion_tokens or body.max_tokens, body.temperature)
    if body.stream:
        return _stream(await start_answer(asker, question, TOP_K, "chat", options), asker)
    answer = await run_answer(asker, question, TOP_K, "chat", options)
    return ChatCompletion(
        id=f"chatcmpl-{answer.trace_id}",
        created=int(time.time()),
        choices=[
            Choice(
                message=AssistantMessage(content=content(answer)),
                finish_reason=finish_reason(answer),
            )
        ],
        citations=answer.citations,
        gateway=_block(answer),
    )


def _refusal(body: ChatRequest) -> JSONResponse | None:
    """The parameters the gateway cannot honour, refused by name rather than ignored."""
    if body.model != MODEL_ID:
        return _unknown_model()
    checks = [
        ("n", (body.n or 1) > 1, "one answer per question: n must be 1"),
        ("tools", bool(body.tools), "tools are not supported: the gateway answers itself"),
        ("functions", bool(body.functions), "functions are not supported"),
        (
            "tool_choice",
            body.tool_choice not in (None, "none", "auto"),
            "tool_choice must be none or auto: the gateway calls no tools",
        ),
        (
            "response_format",
            (body.response_format or {}).get("type", "text") != "text",
            "the answer is text with [n] citations: response_format must be text",
        ),
        ("logprobs", bool(body.logprobs), "logprobs are not available"),
        ("audio", body.audio is not None, "text only: audio is not supported"),
        (
            "modalities",
            any(m != "text" for m in body.modalities or []),
            "text only: audio is not supported",
        ),
    ]
    for param, refused, message in checks:
        if refused:
            return openai_error(400, "unsupported_parameter", message, param)
    other = _other_parts(body.messages)
    if other:  # answering the text alone would answer another question than the one asked
        return openai_error(
            400,
            "unsupported_parameter",
            f"text only: the question's {', '.join(other)} content is not supported",
            "messages",
        )
    return None


def _other_parts(messages: list[ChatMessage]) -> list[str]:
    """The types of the last user message's content parts that are not text."""
    for message in reversed(messages):
        if message.role == "user":
            parts = message.content if isinstance(message.content, list) else []
            return sorted({p.type for p in parts if p.type != "text"})
    return []


def _question(messages: list[ChatMessage]) -> str | None:
    """The last user message's text: the one thing searched."""
    for message in reversed(messages):
        if message.role == "user":
            text = message.text().strip()
            return text if 0 < len(text) <= MAX_QUERY_CHARS else None
    return None


def _unicode(text: str) -> bool:
    """Whether `text` is Unicode the engines can read: JSON's escapes can carry a lone
    surrogate (`"\\ud800"`), which a union of types lets through, and every lane then
    fails on it (a 503 `lanes_unavailable` for a bad request)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def content(answer: AnswerResponse) -> str:
    """The message a chat shows: the answer with its [n], or why there is none."""
    if answer.abstained:
        return ABSTENTIONS.get(answer.abstain_reason or "", FALLBACK)
    return answer.answer


def finish_reason(answer: AnswerResponse) -> Literal["stop", "length"]:
    """OpenAI's reason the message ended: "length" for an answer cut at its token limit
    (a chat may offer to continue it), else "stop"."""
    return "length" if answer.truncated else "stop"


def _block(answer: AnswerResponse) -> GatewayBlock:
    return GatewayBlock(
        abstained=answer.abstained,
        abstain_reason=answer.abstain_reason,
        trace_id=answer.trace_id,
        policy_version=answer.policy_version,
        index_generation=answer.index_generation,
        degraded=answer.degraded,
    )


def _stream(answer: AnswerStream, asker: Asker) -> StreamingResponse:
    ident, created = "chatcmpl-" + _trace_of(answer), int(time.time())

    def chunk(delta: Delta, final: AnswerResponse | None = None) -> bytes:
        event = ChatCompletionChunk(
            id=ident,
            created=created,
            choices=[
                ChunkChoice(
                    delta=delta,
                    finish_reason=finish_reason(final) if final is not None else None,
                )
            ],
            citations=final.citations if final is not None else None,
            gateway=_block(final) if final is not None else None,
        )
        payload = event.model_dump(mode="json")
        payload["choices"][0]["delta"] = delta.model_dump(exclude_none=True)
        if final is None:  # only the last chunk carries them
            del payload["citations"], payload["gateway"]
        return _data(payload)

    async def events() -> AsyncIterator[bytes]:
        yield chunk(Delta(role="assistant", content=""))
        try:
            event = answer.first
            while not isinstance(event, AnswerOutcome):
                event = await anext(answer.events)  # evidence and tokens: see the docstring
            final = finish_answer(answer, asker, event)
            for piece in _pieces(content(final)):
                yield chunk(Delta(content=piece))
            yield chunk(Delta(), final=final)
        except GatewayError as exc:
            problem = exc.problem()
            message = str(problem.get("detail") or problem["title"])
            error = {"message": message, "type": "server_error", "param": None, "code": exc.code}
            yield _data({"error": error})
            yield b"data: [DONE]\n\n"
            await answer.fail()
            return
        except Exception:  # a fault mid-stream: the client is told, never just cut off
            log.exception("a chat completion stream failed")  # type and frames, no message
            message = "the answer failed while it streamed; retry"
            error = {"message": message, "type": "server_error", "param": None,
                     "code": "internal_error"}  # fmt: skip
            yield _data({"error": error})
            yield b"data: [DONE]\n\n"
            await answer.fail()
            return
        except BaseException:
            await answer.fail()
            raise
        await answer.close()
        yield b"data: [DONE]\n\n"

    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


def _trace_of(answer: AnswerStream) -> str:
    return Tracing.trace_id(answer.span)


def _data(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def _pieces(text: str) -> list[str]:
    """The content in a few words per chunk, as a chat app expects it to arrive."""
    words = re.split(r"(?<=\s)(?=\S)", text)  # each word with the space after it
    return ["".join(words[i : i + WORDS_PER_PIECE]) for i in range(0, len(words), WORDS_PER_PIECE)]
