"""/mcp as a client meets it at its edges: the URL with a trailing slash is the same door
(same challenge, same record), and a tool's error, a 200 to the client, is recorded with
the status the route the tool mirrors answers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.embedding import Embedder
from tests.helpers.callers import ALICE, ROOT
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.mcp import HEADERS, call_tool, rpc
from tests.helpers.policies import write_policy

QUERY = "How quickly are refunds paid?"


@pytest.fixture
def served(
    tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder
) -> Iterator[TestClient]:
    settings = make_settings(data_dir, jwks_file, write_policy(tmp_path / "policy"))
    with TestClient(create_app(settings, embedder=embedder)) as client:
        yield client


def call(client: TestClient, path: str, token: str | None, name: str, **arguments: Any) -> Any:
    auth = bearer(token) if token else {}
    body = rpc("tools/call", {"name": name, "arguments": arguments})
    return client.post(path, json=body, headers={**HEADERS, **auth}, follow_redirects=False)


def records_of(client: TestClient, root: str, subject: str, at_least: int) -> list[dict[str, Any]]:
    """The subject's audit records, oldest first, read by the tenant's admin `root` once
    the writer (every 0.2 s) has them."""
    deadline = time.monotonic() + 5
    while True:
        page = client.get("/admin/audit", params={"subject": subject}, headers=bearer(root))
        assert page.status_code == 200, page.text
        found: list[dict[str, Any]] = page.json()["records"]
        if len(found) >= at_least or time.monotonic() > deadline:
            return found[::-1]
        time.sleep(0.1)


def test_mcp_with_a_trailing_slash_is_mcp(served: TestClient, make_token: TokenFactory) -> None:
    """`POST /mcp/` was the generic 401 without the challenge an MCP client follows to
    sign in, and with a token an unrecorded 307 to /mcp."""
    plain, slashed = (call(served, path, None, "search", query=QUERY) for path in ("/mcp", "/mcp/"))
    assert slashed.status_code == plain.status_code == 401
    challenge = slashed.headers["www-authenticate"]
    assert challenge == plain.headers["www-authenticate"]
    assert 'resource_metadata="http://testserver/.well-known/oauth-protected-resource/mcp"' in (
        challenge
    )
    token = make_token(sub="slash-user", groups=["staff"])
    answered = call(served, "/mcp/", token, "search", query=QUERY, top_k=2)
    assert answered.status_code == 200, answered.headers
    result = answered.json()["result"]
    assert not result["isError"] and len(result["structuredContent"]["results"]) == 2
    (record,) = records_of(served, make_token(**ROOT), "slash-user", 1)
    assert (record["route"], record["tool"], record["status"]) == ("/mcp", "search", 200)
    metrics = served.get("/metrics").text  # both 401s, under the one route
    assert 'gateway_requests_total{route="/mcp",status="401"} 2.0' in metrics
    got = served.get("/mcp/", headers={**HEADERS, **bearer(token)}, follow_redirects=False)
    assert got.status_code == 405  # as at /mcp: POST only


def test_a_tool_error_is_recorded_with_the_status_of_the_route_it_mirrors(
    served: TestClient, make_token: TokenFactory
) -> None:
    """The record said 200 for a fetch of a missing ID, which /documents records as 404."""
    token = make_token(sub="tool-errors", groups=["staff"])
    missing = call(served, "/mcp", token, "fetch", id="no-such-document")
    assert missing.status_code == 200 and missing.json()["result"]["isError"] is True
    invalid = call(served, "/mcp", token, "search", query="", top_k=51)
    assert invalid.status_code == 200 and invalid.json()["result"]["isError"] is True
    found = call(served, "/mcp", token, "fetch", id="refund-policy")
    assert found.status_code == 200 and not found.json()["result"]["isError"]
    assert served.get("/documents/no-such-document", headers=bearer(token)).status_code == 404
    records = records_of(served, make_token(**ROOT), "tool-errors", 4)
    assert [(r["route"], r["tool"], r["status"]) for r in records] == [
        ("/mcp", "fetch", 404),
        ("/mcp", "search", 422),  # as /search answers a query it refuses
        ("/mcp", "fetch", 200),
        ("/documents/{doc_id}", None, 404),
    ]
    assert records[2]["doc_ids"] == ["refund-policy"]  # IDs, as ever


def test_a_tool_call_before_any_index_is_recorded_503(
    tmp_path: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    """Before the first ingest /search answers 503 `not_ready`; the search tool's error
    said so to the model but its record said 200."""
    settings = make_settings(tmp_path / "empty", jwks_file, write_policy(tmp_path / "policy"))
    token = make_token(**{**ALICE, "sub": "too-early"})
    with TestClient(create_app(settings, embedder=embedder)) as client:
        called = call(client, "/mcp", token, "search", query=QUERY)
        assert called.status_code == 200
        result = called.json()["result"]
        assert result["isError"] is True and "not_ready" in result["content"][0]["text"]
        searched = client.post("/search", json={"query": QUERY}, headers=bearer(token))
        assert searched.status_code == 503
        records = records_of(client, make_token(**ROOT), "too-early", 2)
    assert [(r["route"], r["status"]) for r in records] == [("/mcp", 503), ("/search", 503)]


def test_the_dev_issuers_tokens_reach_mcp(
    tmp_path: Path, data_dir: Path, embedder: Embedder
) -> None:
    """`gateway serve` with GATEWAY_DEV_ISSUER and no identity settings: a dev token,
    issued for the dev audience, searched at /search but got 403 `insufficient_scope` at
    /mcp, which compared its `aud` with the unset GATEWAY_OIDC_AUDIENCE."""
    import shutil

    from gateway.authn.devissuer import ensure_dev_issuer
    from gateway.settings import Settings

    served_dir = tmp_path / "data"
    shutil.copytree(data_dir, served_dir)
    token = ensure_dev_issuer(served_dir).mint("alice", "acme", "EU", ["staff"])
    settings = Settings(data_dir=served_dir, dev_issuer=True)
    with TestClient(create_app(settings, embedder=embedder)) as client:
        assert (
            client.post("/search", json={"query": QUERY}, headers=bearer(token)).status_code == 200
        )
        result = call_tool(client, token, "search", query=QUERY)
    assert result["isError"] is False
    assert result["structuredContent"]["results"]  # alice's refund policy, found


def test_a_call_the_sdk_refuses_before_any_tool_runs_is_counted(
    served: TestClient, make_token: TokenFactory
) -> None:
    """Invalid arguments and an unknown tool are tool errors to the client; the tools'
    counter missed them, since no tool's code ran."""
    token = make_token(**ALICE)
    for name, arguments in (("search", {"query": ""}), ("nosuch", {})):
        answered = call(served, "/mcp", token, name, **arguments)
        assert answered.status_code == 200 and '"isError":true' in answered.text.replace(" ", "")
    metrics = served.get("/metrics").text
    assert 'gateway_mcp_tool_calls_total{outcome="tool_error",tool="search"} 1.0' in metrics
    assert 'gateway_mcp_tool_calls_total{outcome="tool_error",tool="other"} 1.0' in metrics
