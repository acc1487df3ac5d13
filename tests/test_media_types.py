"""A body is JSON, in UTF-8, uncompressed, or it is refused 415 before it is read, in the
error shape of the door it came to (problem+json; OpenAI's under /v1; SCIM's under
/scim/v2); a body without a Content-Type is read as JSON.

Before, `text/plain` or curl's default `application/x-www-form-urlencoded` got a 422
saying the valid JSON object sent was no object, a body without a Content-Type the same
422, `/admin/documents` and SCIM took any type, `/mcp` answered a plain-text 400, and a
gzipped body got a 422 "not UTF-8" while an uncompressed one labelled gzip was served.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.helpers.callers import ALICE, ROOT
from tests.helpers.identity import TokenFactory, bearer
from tests.helpers.mcp import HEADERS, rpc
from tests.helpers.scim import SCIM_JSON, USER, Scim

PROBLEM = "application/problem+json"
SEARCH = json.dumps({"query": "How quickly are refunds paid?", "top_k": 3}).encode()
NOT_JSON_TYPES = ["text/plain", "application/x-www-form-urlencoded", "application/xml"]


def post(client: TestClient, path: str, body: Any, token: str | None, **headers: str) -> Any:
    auth = bearer(token) if token else {}
    return client.post(path, content=body, headers={**auth, **headers})


def refused(response: Any) -> dict[str, Any]:
    """The problem of a 415, which closes the connection: the body was never read."""
    assert response.status_code == 415, response.text
    assert response.headers["content-type"] == PROBLEM
    assert response.headers["connection"] == "close"
    problem: dict[str, Any] = response.json()
    assert problem["code"] == "unsupported_media_type" and problem["status"] == 415
    return problem


@pytest.mark.parametrize("media_type", NOT_JSON_TYPES)
def test_a_body_of_another_media_type_is_a_415_naming_what_was_sent_and_what_is_accepted(
    client: TestClient, make_token: TokenFactory, media_type: str
) -> None:
    for path, token in (("/search", make_token(**ALICE)), ("/admin/documents", make_token(**ROOT))):
        problem = refused(post(client, path, SEARCH, token, **{"content-type": media_type}))
        assert media_type in problem["detail"] and "application/json" in problem["detail"]
    # Decided from the headers alone, as the body limit is: no credential is checked.
    anonymous = post(client, "/search", SEARCH, None, **{"content-type": media_type})
    assert refused(anonymous)["detail"] == problem["detail"]


@pytest.mark.parametrize(
    "headers",
    [
        {},  # scripts often send none: read as JSON
        {"content-type": "application/json"},
        {"content-type": 'Application/JSON; charset="UTF-8"'},
        {"content-type": "application/vnd.example+json"},
        {"content-type": "application/json", "content-encoding": "identity"},
    ],
)
def test_a_json_body_in_utf8_is_searched(
    client: TestClient, make_token: TokenFactory, headers: dict[str, str]
) -> None:
    response = post(client, "/search", SEARCH, make_token(**ALICE), **headers)
    assert response.status_code == 200, response.text
    assert response.json()["results"]


def test_a_chunked_body_without_a_length_is_checked_as_well(
    client: TestClient, make_token: TokenFactory
) -> None:
    def chunks() -> Iterator[bytes]:
        yield SEARCH

    headers = {**bearer(make_token(**ALICE)), "content-type": "text/plain"}
    refused(client.post("/search", content=chunks(), headers=headers))
    headers["content-type"] = "application/json"
    assert client.post("/search", content=chunks(), headers=headers).status_code == 200


def test_a_charset_other_than_utf8_is_a_415(client: TestClient, make_token: TokenFactory) -> None:
    latin = json.dumps({"query": "Rückerstattung"}, ensure_ascii=False).encode("latin-1")
    response = post(
        client,
        "/search",
        latin,
        make_token(**ALICE),
        **{"content-type": "application/json; charset=ISO-8859-1"},
    )
    detail = refused(response)["detail"]
    assert "iso-8859-1" in detail and "UTF-8" in detail


def test_a_compressed_body_is_a_415_asking_for_identity(
    client: TestClient, make_token: TokenFactory
) -> None:
    token = make_token(**ALICE)
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    # Really compressed, and mislabelled (which was served as if uncompressed).
    for body in (gzip.compress(SEARCH), SEARCH):
        response = post(client, "/search", body, token, **headers)
        problem = refused(response)
        assert response.headers["accept-encoding"] == "identity"
        assert "gzip" in problem["detail"] and "identity" in problem["detail"]


def test_what_was_sent_is_named_only_when_it_is_a_media_type(
    client: TestClient, make_token: TokenFactory
) -> None:
    secret = "text/plain, Bearer-looking-secret value"
    response = post(client, "/search", SEARCH, make_token(**ALICE), **{"content-type": secret})
    assert "secret" not in refused(response)["detail"]


def test_a_request_without_a_body_is_not_judged_by_its_content_type(
    client: TestClient, make_token: TokenFactory
) -> None:
    token = make_token(**ALICE)
    # The route's own answer to a missing body, not a 415: there is nothing to read.
    empty = post(client, "/search", b"", token, **{"content-type": "text/plain"})
    assert empty.status_code == 422 and empty.json()["code"] == "validation_error"
    # Nothing with no body to send is refused: a GET, a DELETE, a preflight.
    typed = {**bearer(token), "content-type": "text/plain", "content-encoding": "gzip"}
    assert client.get("/documents/refunds", headers=typed).status_code in (200, 404)
    assert client.delete("/admin/documents/nothing-here", headers=typed).status_code == 403


def test_openai_clients_get_the_415_in_openais_shape(
    client: TestClient, make_token: TokenFactory
) -> None:
    body = json.dumps({"model": "gateway", "messages": [{"role": "user", "content": "refunds?"}]})
    token = make_token(**ALICE)
    for headers in ({"content-type": "text/plain"}, {"content-encoding": "br"}):
        response = post(client, "/v1/chat/completions", body, token, **headers)
        assert response.status_code == 415, response.text
        error = response.json()["error"]
        assert error["code"] == "unsupported_media_type"
        assert error["type"] == "invalid_request_error"
        assert "application/json" in error["message"] or "identity" in error["message"]


def test_a_directory_gets_the_415_as_a_scim_error_and_nothing_changes(acme: Scim) -> None:
    before = acme.everything()
    body = json.dumps({"schemas": [USER], "userName": "typed@acme.example"})
    for headers in ({"content-type": "text/plain"}, {"content-encoding": "gzip"}):
        response = acme.client.post(
            "/scim/v2/Users", content=body, headers={**acme.headers, **headers}
        )
        assert response.status_code == 415, response.text
        assert response.headers["content-type"].startswith(SCIM_JSON)
        error = response.json()
        assert error["status"] == "415" and error["detail"].startswith("unsupported_media_type")
    assert acme.everything() == before
    created = acme.client.post(
        "/scim/v2/Users", content=body, headers={**acme.headers, "content-type": SCIM_JSON}
    )
    assert created.status_code == 201, created.text


def test_mcp_answers_a_415_problem_and_reads_a_body_without_a_type_as_json(
    client: TestClient, make_token: TokenFactory
) -> None:
    auth = bearer(make_token(**ALICE))
    listing = json.dumps(rpc("tools/list"))
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        headers = {**HEADERS, **auth, "content-type": content_type}
        refused(client.post("/mcp", content=listing, headers=headers))
    # A JSON type the SDK would refuse itself (it takes `application/json` only), and none.
    untyped = {name: value for name, value in HEADERS.items() if name != "Content-Type"}
    for typed in ({"content-type": "application/vnd.example+json"}, {}):
        response = client.post("/mcp", content=listing, headers={**untyped, **auth, **typed})
        assert response.status_code == 200, response.text
        assert {tool["name"] for tool in response.json()["result"]["tools"]} >= {"search"}
    # The stream and the session's end stay 405: no server stream, no session.
    assert client.get("/mcp", headers={**HEADERS, **auth}).status_code == 405
    assert client.delete("/mcp", headers={**HEADERS, **auth}).status_code == 405
