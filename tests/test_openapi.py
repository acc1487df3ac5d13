"""The checked-in openapi.yaml is what the app serves (it drifts only with a failing test),
and the bodies and statuses it describes for invalid requests are the ones sent."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from gateway.api.openapi import render
from gateway.api.schemas import Problem
from tests.helpers.identity import TokenFactory, bearer

CHECKED_IN = Path(__file__).resolve().parent.parent / "openapi.yaml"


def test_checked_in_openapi_matches_the_app() -> None:
    assert CHECKED_IN.read_text() == render(), "run `make openapi` and commit openapi.yaml"


def test_contract_routes_and_problem_responses() -> None:
    schema = yaml.safe_load(render())
    assert set(schema["paths"]) == {
        "/healthz",
        "/readyz",
        "/metrics",
        "/search",
        "/answer",
        "/documents/{doc_id}",
        "/chunks/{chunk_id}",
        "/admin/policy",
        "/admin/policy/reload",
        "/admin/explain",
        "/admin/documents/{doc_id}",
        "/admin/documents/{doc_id}/acl",
        "/admin/documents",
        "/admin/jobs/{job_id}",
        "/admin/audit",
        "/admin/policy/preview",
        "/admin/index",
        "/.well-known/oauth-protected-resource/mcp",
        "/v1/models",
        "/v1/models/{model}",
        "/v1/chat/completions",
    }
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")):
                    assert set(response["content"]) == {error_type(path)}, path
    answer = schema["components"]["schemas"]["AnswerResponse"]["properties"]
    assert {"answer", "abstained", "abstain_reason", "citations", "timings_ms"} <= set(answer)


PROBLEM = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
OPENAI = {"application/json": {"schema": {"$ref": "#/components/schemas/OpenAIError"}}}
WITH_BODY = ("post", "put", "patch", "delete")


def error_type(path: str) -> str:
    """Errors are problems, except under /v1/: OpenAI's JSON, which its clients read."""
    return "application/json" if path.startswith("/v1/") else "application/problem+json"


def sent_on_error(path: str) -> dict[str, object]:
    return OPENAI if path.startswith("/v1/") else PROBLEM


def test_validation_problems_are_documented_as_the_problem_body_sent() -> None:
    schema = yaml.safe_load(render())
    components = schema["components"]["schemas"]
    assert not {"HTTPValidationError", "ValidationError"} & set(components)
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            takes_input = "requestBody" in operation or operation.get("parameters")
            if takes_input and path.startswith("/v1/"):  # as OpenAI: an invalid body is 400
                assert "422" not in operation["responses"], (method, path)
                assert operation["responses"]["400"]["content"] == OPENAI, (method, path)
            elif takes_input:
                assert operation["responses"]["422"]["content"] == PROBLEM, (method, path)
    errors = components["Problem"]["properties"]["errors"]["anyOf"][0]
    assert errors["items"] == {
        "anyOf": [
            {"$ref": "#/components/schemas/FieldError"},
            {"$ref": "#/components/schemas/DocumentError"},  # POST /admin/documents
        ]
    }
    assert components["FieldError"]["required"] == ["loc", "msg", "type"]
    assert components["DocumentError"]["required"] == ["index", "doc_id", "field", "message"]
    assert {"errors", "serving_version"} <= set(components["Problem"]["properties"])  # extensions


def test_every_route_that_may_take_a_body_documents_413() -> None:
    schema = yaml.safe_load(render())
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if method in WITH_BODY:
                assert operation["responses"]["413"]["content"] == sent_on_error(path), path


def test_each_event_of_a_streamed_answer_is_documented() -> None:
    schema = yaml.safe_load(render())
    ok = schema["paths"]["/answer"]["post"]["responses"]["200"]["content"]
    assert set(ok) == {"application/json", "text/event-stream"}
    events = {}
    for event in ok["text/event-stream"]["schema"]["oneOf"]:
        assert event["required"] == ["event", "data"]
        data = event["properties"]["data"]
        assert data["type"] == "string" and data["contentMediaType"] == "application/json"
        events[event["properties"]["event"]["const"]] = data["contentSchema"]
    assert set(events) == {"evidence", "token", "final", "error"}
    assert events["final"] == {"$ref": "#/components/schemas/AnswerResponse"}
    assert events["error"] == {"$ref": "#/components/schemas/Problem"}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/search", b'{"query": "refund \xff\xfe"}'),  # not UTF-8: FastAPI's own answer is a 400
        ("/answer", b'{"query": "refund \xff\xfe"}'),
        ("/search", b'{"query": "refund", "top_k": "4"}'),  # the schema's integer is no string
        ("/search", b'{"query": "refund", "top_k": true}'),
        ("/answer", b'{"query": "refund", "stream": 1}'),  # nor is its boolean a number
    ],
)
def test_a_body_the_document_refuses_is_a_422_problem(
    client: TestClient, make_token: TokenFactory, path: str, body: bytes
) -> None:
    headers = {**bearer(make_token()), "Content-Type": "application/json"}
    response = client.post(path, content=body, headers=headers)
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    problem = Problem.model_validate(response.json())
    assert problem.code == "validation_error" and problem.errors
    assert b"refund" not in response.content  # locations and messages, never the input


def test_an_undeclared_method_is_a_405_naming_the_allowed_ones(
    client: TestClient, make_token: TokenFactory
) -> None:
    response = client.put("/search", json={"query": "refund"}, headers=bearer(make_token()))
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert response.headers["content-type"] == "application/problem+json"
