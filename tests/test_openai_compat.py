"""/v1 through OpenAI's own Python SDK: a chat app's view of the gateway.

In process (the SDK's transport hands requests to the app) for most, and once over real
HTTP to a `gateway serve`. What a user of the SDK notices: the answer and its citations are
/answer's, streamed or not; errors arrive as the SDK's own exceptions with the gateway's
code; what the gateway cannot do is refused by name; the caller is the same caller.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

from gateway.api.app import create_app
from gateway.authn.apikeys import create_key
from gateway.embedding import Embedder
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ALICE, HIDDEN_FROM_ALICE, ROOT
from tests.helpers.clients import openai_sdk
from tests.helpers.datadirs import copy_data_dir
from tests.helpers.identity import AUDIENCE, ISSUER, TokenFactory, bearer, make_settings
from tests.helpers.llm import FakeLlm, cite_block_with, llm_apps
from tests.helpers.policies import write_policy
from tests.helpers.processes import gateway_env, running_server

QUESTION = "How quickly are refunds paid?"
USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION}]


def answer_of(client: TestClient, token: str, query: str = QUESTION) -> Any:
    response = client.post("/answer", json={"query": query}, headers=bearer(token))
    assert response.status_code == 200, response.text
    return response.json()


def test_models_lists_the_gateway(client: TestClient, make_token: TokenFactory) -> None:
    listed = list(openai_sdk(client, make_token(**ALICE)).models.list())
    assert [m.id for m in listed] == ["gateway"]
    assert listed[0].object == "model"


def test_the_sdk_retrieves_the_gateway_model_and_no_other(
    client: TestClient, make_token: TokenFactory
) -> None:
    sdk = openai_sdk(client, make_token(**ALICE))
    assert sdk.models.retrieve("gateway") == next(iter(sdk.models.list()))
    for other in ("gpt-4o", "org/model"):
        with pytest.raises(openai.NotFoundError) as missing:
            sdk.models.retrieve(other)
        assert (missing.value.code, missing.value.param) == ("model_not_found", "model")
    with pytest.raises(openai.AuthenticationError):  # as /v1/models: a token first
        openai_sdk(client, "not-a-token").models.retrieve("gateway")


def test_a_completion_is_the_answer_with_its_citations(
    client: TestClient, make_token: TokenFactory
) -> None:
    token = make_token(**ALICE)
    reply = openai_sdk(client, token).chat.completions.create(model="gateway", messages=USER)
    expected = answer_of(client, token)
    assert expected["abstained"] is False
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    (choice,) = reply.choices
    assert choice.message.role == "assistant" and choice.finish_reason == "stop"
    assert choice.message.content == expected["answer"]
    extra = reply.model_extra or {}
    assert extra["citations"] == expected["citations"]
    assert "refund-policy@2:0" in {c["chunk_id"] for c in extra["citations"]}
    block = extra["gateway"]
    assert set(block) == {
        "abstained",
        "abstain_reason",
        "trace_id",
        "policy_version",
        "index_generation",
        "degraded",
    }
    assert block["abstained"] is False and reply.id == f"chatcmpl-{block['trace_id']}"


def test_streamed_content_is_the_plain_content_and_the_last_chunk_cites(
    client: TestClient, make_token: TokenFactory
) -> None:
    sdk = openai_sdk(client, make_token(**ALICE))
    plain = sdk.chat.completions.create(model="gateway", messages=USER)
    with sdk.chat.completions.create(model="gateway", messages=USER, stream=True) as stream:
        chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == plain.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    last = chunks[-1]
    assert last.choices[0].finish_reason == "stop"
    assert (last.model_extra or {})["citations"] == (plain.model_extra or {})["citations"]
    assert (last.model_extra or {})["gateway"]["abstained"] is False
    assert all("citations" not in (c.model_extra or {}) for c in chunks[:-1])


def test_the_question_is_the_last_user_message_and_nothing_hidden_is_cited(
    client: TestClient, make_token: TokenFactory
) -> None:
    sdk = openai_sdk(client, make_token(**ALICE))
    for code in HIDDEN_FROM_ALICE:
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": "Within 5 days [1]."},
            {"role": "user", "content": [{"type": "text", "text": f"What is {code}?"}]},
        ]
        reply = sdk.chat.completions.create(model="gateway", messages=messages)
        cited = (reply.model_extra or {})["citations"]
        assert code not in str(reply.choices[0].message.content)
        assert all(code not in c["title"] for c in cited)
        if (reply.model_extra or {})["gateway"]["abstained"]:
            assert cited == [] and reply.choices[0].message.content  # says why, not nothing


def test_an_abstention_says_so_in_the_content(client: TestClient, make_token: TokenFactory) -> None:
    sdk = openai_sdk(client, make_token(**ALICE))
    question: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "zqxv wvuty plomb kraxx"}
    ]
    reply = sdk.chat.completions.create(model="gateway", messages=question)
    block = (reply.model_extra or {})["gateway"]
    assert block["abstained"] is True and block["abstain_reason"]
    assert reply.choices[0].message.content and (reply.model_extra or {})["citations"] == []


def test_a_bad_token_is_the_sdks_authentication_error(client: TestClient) -> None:
    with pytest.raises(openai.AuthenticationError) as raised:
        openai_sdk(client, "not-a-token").chat.completions.create(model="gateway", messages=USER)
    assert raised.value.status_code == 401 and raised.value.code == "unauthenticated"
    assert raised.value.type == "authentication_error"
    assert raised.value.response.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logprobs": True}, "logprobs"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
    ],
)
def test_what_the_gateway_cannot_do_is_refused_by_name(
    client: TestClient, make_token: TokenFactory, extra: dict[str, Any], param: str
) -> None:
    sdk = openai_sdk(client, make_token(**ALICE))
    with pytest.raises(openai.BadRequestError) as raised:
        sdk.chat.completions.create(model="gateway", messages=USER, **extra)
    assert raised.value.param == param and raised.value.code == "unsupported_parameter"


def test_parameters_chat_apps_send_are_accepted(
    client: TestClient, make_token: TokenFactory
) -> None:
    sdk = openai_sdk(client, make_token(**ALICE))
    reply = sdk.chat.completions.create(
        model="gateway",
        messages=USER,
        n=1,
        temperature=0.2,
        top_p=0.9,
        max_tokens=200,
        seed=1,
        stop=["\n\n"],
        user="someone",
        presence_penalty=0,
        stream_options=None,
        extra_body={"keep_alive": "5m", "session_id": "abc"},
    )
    assert reply.choices[0].message.content


def test_invalid_requests_are_openai_400s_and_other_models_404(
    client: TestClient, make_token: TokenFactory
) -> None:
    sdk = openai_sdk(client, make_token(**ALICE))
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.chat.completions.create(model="gpt-4o", messages=USER)
    assert missing.value.code == "model_not_found"
    wrong: list[Any] = [[], [{"role": "assistant", "content": "hi"}], [{"role": "user"}]]
    for messages in wrong:
        with pytest.raises(openai.BadRequestError) as invalid:
            sdk.chat.completions.create(model="gateway", messages=messages)
        assert invalid.value.param == "messages"
    raw = client.post("/v1/chat/completions", json={"model": "gateway", "messages": "x"})
    assert raw.status_code == 401 and set(raw.json()) == {"error"}  # no token comes first


def test_an_image_in_the_question_is_refused_by_name_not_dropped(
    client: TestClient, make_token: TokenFactory
) -> None:
    sdk = openai_sdk(client, make_token(**ALICE))
    picture = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    asked: list[Any] = [{"role": "user", "content": [{"type": "text", "text": QUESTION}, picture]}]
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.chat.completions.create(model="gateway", messages=asked)
    assert refused.value.code == "unsupported_parameter" and refused.value.param == "messages"
    assert "image_url" in str(refused.value)
    earlier: list[Any] = [
        asked[0],
        {"role": "user", "content": [{"type": "text", "text": QUESTION}]},
    ]
    answered = sdk.chat.completions.create(model="gateway", messages=earlier)
    assert answered.choices[0].message.content


def test_a_question_that_is_not_unicode_is_a_400_not_a_lane_failure(
    client: TestClient, make_token: TokenFactory
) -> None:
    """A lone surrogate in JSON's escapes, as a string and as a text part: refused as
    /search and /answer refuse it, not searched until every lane fails (a 503)."""
    token = make_token(**ALICE)
    for content in ('"\\ud800 refunds"', '[{"type": "text", "text": "\\ud800 refunds"}]'):
        body = f'{{"model": "gateway", "messages": [{{"role": "user", "content": {content}}}]}}'
        response = client.post(
            "/v1/chat/completions",
            content=body,
            headers={**bearer(token), "Content-Type": "application/json"},
        )
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "validation_error" and error["param"] == "messages"
    searched = client.post(
        "/search",
        content='{"query": "\\ud800 refunds"}',
        headers={**bearer(token), "Content-Type": "application/json"},
    )
    assert searched.status_code == 422


def test_a_bad_content_part_is_named_not_called_a_bad_string(
    client: TestClient, make_token: TokenFactory
) -> None:
    """A list of content parts with a bad part was answered "content.str: Input should be
    a valid string": the error of the string form, which the client had not sent."""
    token = make_token(**ALICE)
    cases: list[tuple[Any, str]] = [
        (
            [{"type": "text", "text": 5}],
            "messages.0.content.list.0.text: Input should be a valid string",
        ),
        ([{"text": QUESTION}], "messages.0.content.list.0.type: Field required"),
        ([QUESTION], "messages.0.content.list.0: Input should be a valid dictionary"),
        (5, "messages.0.content: Input should be a string or a list of content parts"),
    ]
    for content, said in cases:
        body = {"model": "gateway", "messages": [{"role": "user", "content": content}]}
        response = client.post("/v1/chat/completions", json=body, headers=bearer(token))
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "validation_error" and error["param"] == "messages"
        assert error["message"].startswith(f"invalid {said}"), error["message"]


def test_an_ingest_key_is_the_sdks_permission_error(client: TestClient, data_dir: Path) -> None:
    token, _ = create_key(
        DataLayout(data_dir).open_catalog(),
        tenant="acme",
        region="EU",
        principals=[],
        scope="ingest",
    )
    with pytest.raises(openai.PermissionDeniedError) as raised:
        openai_sdk(client, token).models.list()
    assert raised.value.code == "forbidden"


@pytest.fixture
def limited_app(
    tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder
) -> Iterator[TestClient]:
    limits = {"per_subject": {"rate_per_s": 0.01, "burst": 2}}
    policy = write_policy(tmp_path / "policy", limits=limits)
    with TestClient(create_app(make_settings(data_dir, jwks_file, policy), embedder=embedder)) as c:
        yield c


def test_same_caller_same_record_same_rate_limit(
    limited_app: TestClient, make_token: TokenFactory
) -> None:
    token = make_token(sub="chatter", groups=["staff"])  # its own records in a shared catalog
    sdk = openai_sdk(limited_app, token)
    reply = sdk.chat.completions.create(model="gateway", messages=USER)
    searched = limited_app.post("/search", json={"query": "x"}, headers=bearer(token))
    assert searched.status_code == 200
    with pytest.raises(openai.RateLimitError) as raised:  # the /search spent the second
        sdk.chat.completions.create(model="gateway", messages=USER)
    assert raised.value.code == "rate_limited"
    assert int(raised.value.response.headers["retry-after"]) >= 1
    cited = [c["chunk_id"] for c in (reply.model_extra or {})["citations"]]
    assert limited_app.app.state.gateway.audit.flush()  # type: ignore[attr-defined]
    root = bearer(make_token(**ROOT))
    page = limited_app.get("/admin/audit", params={"subject": "chatter"}, headers=root).json()
    chats = [r for r in page["records"] if r["route"] == "/v1/chat/completions"]
    assert sorted(r["status"] for r in chats) == [200, 429]
    ok = next(r for r in chats if r["status"] == 200)
    assert ok["chunk_ids"] == cited and ok["tool"] is None
    metrics = limited_app.get("/metrics").text
    assert 'gateway_requests_total{route="/v1/chat/completions",status="429"}' in metrics


@pytest.fixture
def llm_client(data_dir: Path, jwks_file: Path, embedder: Embedder) -> Iterator[Callable[..., Any]]:
    with llm_apps(data_dir, jwks_file, embedder) as start:
        yield start


def test_max_tokens_and_temperature_reach_the_llm_and_no_token_does(
    llm_client: Callable[..., TestClient], make_token: TokenFactory
) -> None:
    fake = FakeLlm(cite_block_with("RPL-14", "Refunds are paid within 5 days."))
    token = make_token(**ALICE)
    sdk = openai_sdk(llm_client(fake), token)
    reply = sdk.chat.completions.create(
        model="gateway",
        messages=USER,
        max_tokens=40,
        temperature=0.7,
    )
    assert reply.choices[0].message.content == "Refunds are paid within 5 days. [1]"
    huge = sdk.chat.completions.create(
        model="gateway",
        messages=USER,
        max_completion_tokens=10**6,
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in huge if c.choices).endswith("[1]")
    first, second = fake.requests
    assert first["max_tokens"] == 40 and first["temperature"] == 0.7
    assert second["max_tokens"] == 300  # the policy's answer_tokens: never more
    assert token not in str(fake.requests)


@pytest.mark.server
def test_the_sdk_over_real_http(
    tmp_path: Path, data_dir: Path, jwks_file: Path, make_token: TokenFactory
) -> None:
    env = gateway_env(
        GATEWAY_DATA_DIR=str(copy_data_dir(data_dir, tmp_path / "data")),
        GATEWAY_OIDC_ISSUER=ISSUER,
        GATEWAY_OIDC_AUDIENCE=AUDIENCE,
        GATEWAY_JWKS_URI=jwks_file.as_uri(),
    )
    server: tuple[str, subprocess.Popen[bytes]]
    with running_server(env) as server:
        base, _ = server
        sdk = OpenAI(base_url=f"{base}/v1", api_key=make_token(**ALICE), max_retries=0)
        reply = sdk.chat.completions.create(model="gateway", messages=USER)
        with sdk.chat.completions.create(model="gateway", messages=USER, stream=True) as stream:
            chunks = list(stream)
        with pytest.raises(openai.AuthenticationError):
            OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).models.list()
    content = reply.choices[0].message.content
    assert content and "[1]" in content
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == content
    assert (chunks[-1].model_extra or {})["citations"] == (reply.model_extra or {})["citations"]


def test_a_body_that_is_not_json_names_no_parameter(
    client: TestClient, make_token: TokenFactory
) -> None:
    """A cut body's error has an offset for a location; as `param` it named parameter "9"."""
    refused = client.post(
        "/v1/chat/completions",
        content=b'{"model":',
        headers={**bearer(make_token(**ALICE)), "Content-Type": "application/json"},
    )
    assert refused.status_code == 400
    assert refused.json()["error"] == {
        "message": "the request body is not valid JSON",
        "type": "invalid_request_error",
        "param": None,
        "code": "validation_error",
    }
