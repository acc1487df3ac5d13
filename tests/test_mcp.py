"""/mcp through the official MCP SDK's client against a real `gateway serve`, and its HTTP
exchanges (challenge, metadata, audiences, Origin, limits) as any MCP client meets them.

What an agent's user notices: the three tools and their bounds; that `search`, `fetch` and
`answer` give exactly what /search, /chunks, /documents and /answer give the same caller;
that a hidden ID and a missing one are the same error; that a client without a token is
told where to get one; and that each call is audited, counted and rate-limited.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from mcp import Client
from mcp.shared.auth import ProtectedResourceMetadata
from mcp.shared.exceptions import MCPError

from gateway.api import mcp_tools
from gateway.api.app import create_app
from gateway.api.audit import record_required
from gateway.api.ratelimit import SharedRateLimiter
from gateway.authn.apikeys import create_key
from gateway.bench.server import free_port
from gateway.embedding import Embedder
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ALICE, BOB, HIDDEN_FROM_ALICE, ROOT
from tests.helpers.datadirs import copy_data_dir
from tests.helpers.identity import AUDIENCE, ISSUER, TokenFactory, bearer, make_settings
from tests.helpers.mcp import HEADERS, call_tool, post, rpc, with_client
from tests.helpers.policies import write_policy
from tests.helpers.processes import gateway_env, running_server

ALLOWED_ORIGIN = "https://console.example"
METADATA = "/.well-known/oauth-protected-resource/mcp"
QUERY = "How quickly are refunds paid?"


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, data_dir: Path, jwks_file: Path
) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mcp-served")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = gateway_env(
        GATEWAY_DATA_DIR=str(copy_data_dir(data_dir, root / "data")),
        GATEWAY_POLICY_DIR=str(write_policy(root / "policy")),
        GATEWAY_OIDC_ISSUER=ISSUER,
        GATEWAY_OIDC_AUDIENCE=AUDIENCE,
        GATEWAY_JWKS_URI=jwks_file.as_uri(),
        GATEWAY_PUBLIC_URL=base,
        GATEWAY_ALLOWED_ORIGINS=f"{ALLOWED_ORIGIN}, https://other.example",
    )
    started: tuple[str, subprocess.Popen[bytes]]
    with running_server(env, port=port) as started:
        yield started[0]


def rest(base: str, token: str, path: str, **body: Any) -> Any:
    response = httpx.post(f"{base}{path}", json=body, headers=bearer(token), timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.server
@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_the_sdk_lists_three_bounded_tools_and_search_is_slash_search(
    server: str, make_token: TokenFactory, mode: str
) -> None:
    token = make_token(**ALICE)

    async def use(client: Client) -> Any:
        tools = (await client.list_tools()).tools
        return tools, await client.call_tool("search", {"query": QUERY, "top_k": 5})

    tools, result = with_client(server, token, use, mode)
    by_name = {t.name: t for t in tools}
    assert set(by_name) == {"search", "fetch", "answer"}
    search = by_name["search"].input_schema["properties"]
    assert search["top_k"]["maximum"] == 50 and search["top_k"]["minimum"] == 1
    assert search["query"]["maxLength"] == 2000 and search["query"]["minLength"] == 1
    assert all(t.output_schema and t.description for t in tools)
    assert all(t.annotations and t.annotations.read_only_hint for t in tools)
    assert not result.is_error
    assert json.loads(result.content[0].text) == result.structured_content
    expected = rest(server, token, "/search", query=QUERY, top_k=5)["results"]
    hits = result.structured_content["results"]
    assert [h["id"] for h in hits] == [r["chunk_id"] for r in expected]
    assert [(h["doc_id"], h["url"], h["text"]) for h in hits] == [
        (r["doc_id"], r["uri"], r["text"]) for r in expected
    ]


@pytest.mark.server
def test_fetch_reads_what_the_caller_may_and_hidden_equals_missing(
    server: str, make_token: TokenFactory
) -> None:
    token = make_token(**ALICE)
    bob = make_token(**BOB)  # sees what Alice may not
    found = rest(server, bob, "/search", query=HIDDEN_FROM_ALICE[0])["results"]
    hidden = next(r["chunk_id"] for r in found if HIDDEN_FROM_ALICE[0] in r["text"])

    async def use(client: Client) -> Any:
        return [
            await client.call_tool("fetch", {"id": ident})
            for ident in ("refund-policy@2:0", "refund-policy", hidden, "no-such@1:0", "nothing")
        ]

    chunk, document, *refused = with_client(server, token, use)
    assert chunk.structured_content["id"] == "refund-policy@2:0"
    shown = httpx.get(f"{server}/chunks/refund-policy@2:0", headers=bearer(token)).json()
    assert chunk.structured_content["text"] == shown["text"]
    assert chunk.structured_content["metadata"]["doc_id"] == "refund-policy"
    whole = httpx.get(f"{server}/documents/refund-policy", headers=bearer(token)).json()
    assert document.structured_content["text"] == whole["text"]
    assert document.structured_content["metadata"]["version"] == whole["version"]
    assert all(r.is_error for r in refused)
    texts = {r.content[0].text for r in refused}
    assert len(texts) == 1 and "not found" in texts.pop()
    assert not any(hidden in str(r.content) for r in refused)


@pytest.mark.server
def test_answer_is_slash_answer(server: str, make_token: TokenFactory) -> None:
    token = make_token(**ALICE)

    async def use(client: Client) -> Any:
        return await client.call_tool("answer", {"query": QUERY})

    result = with_client(server, token, use)
    expected = rest(server, token, "/answer", query=QUERY)
    got = result.structured_content
    assert got is not None and got["answer"] == expected["answer"] and not got["abstained"]
    assert got["citations"] == expected["citations"]


@pytest.mark.server
def test_without_credentials_the_challenge_names_the_metadata(
    server: str, make_token: TokenFactory
) -> None:
    metadata = f'resource_metadata="{server}/.well-known/oauth-protected-resource/mcp"'
    plain = httpx.post(f"{server}/mcp", json=rpc("tools/list"), headers=HEADERS)
    assert plain.status_code == 401
    assert plain.headers["www-authenticate"] == f"Bearer {metadata}"
    bad = httpx.post(f"{server}/mcp", json=rpc("tools/list"), headers={**HEADERS, **bearer("x")})
    assert bad.status_code == 401
    assert bad.headers["www-authenticate"] == f'Bearer {metadata}, error="invalid_token"'

    async def use(client: Client) -> Any:
        return await client.list_tools()

    with pytest.raises(Exception) as refused:  # the SDK's task group wraps its MCPError
        with_client(server, "not-a-token", use)
    group = refused.value
    assert isinstance(group, MCPError) or refused.group_contains(MCPError, depth=None)
    for path in (
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
    ):
        response = httpx.get(f"{server}{path}")  # no token: it is public
        assert response.status_code == 200
        document = ProtectedResourceMetadata.model_validate(response.json())
        assert str(document.resource) == f"{server}/mcp"
        assert [str(s) for s in document.authorization_servers] == [ISSUER]
        assert document.bearer_methods_supported == ["header"]


@pytest.mark.server
def test_the_resource_is_an_audience_at_mcp_only(server: str, make_token: TokenFactory) -> None:
    for_mcp = make_token(**ALICE, aud=f"{server}/mcp", scope="openid search")
    both = make_token(**ALICE, aud=[f"{server}/mcp", "someone-else"], scp=["search"])
    elsewhere = make_token(**ALICE, aud="https://elsewhere.example/mcp", scope="search")
    unscoped = make_token(**ALICE, aud=f"{server}/mcp", scope="openid")

    def at_mcp(token: str, **headers: str) -> httpx.Response:
        sent = {**HEADERS, **bearer(token), **headers}
        return httpx.post(f"{server}/mcp", json=rpc("tools/list"), headers=sent)

    assert at_mcp(for_mcp).status_code == 200 and at_mcp(both).status_code == 200
    searched = httpx.post(f"{server}/search", json={"query": QUERY}, headers=bearer(for_mcp))
    assert searched.status_code == 401
    refused = at_mcp(elsewhere)
    assert refused.status_code == 401 and "invalid_token" in refused.headers["www-authenticate"]
    # A Host naming that other server changes nothing: the resource is the configured one.
    assert at_mcp(elsewhere, Host="elsewhere.example").status_code == 401
    # A token for the resource alone must carry the scope `search`; the 403 names it.
    lacking = at_mcp(unscoped)
    assert lacking.status_code == 403
    challenge = lacking.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge and 'scope="search"' in challenge
    assert f'resource_metadata="{server}{METADATA}"' in challenge


@pytest.mark.server
def test_an_origin_not_allowed_is_403_before_anything(
    server: str, make_token: TokenFactory
) -> None:
    token, listed = make_token(**ALICE), rpc("tools/list")
    for headers in ({}, bearer(token)):
        evil = {**HEADERS, **headers, "Origin": "https://evil.example"}
        assert httpx.post(f"{server}/mcp", json=listed, headers=evil).status_code == 403
    good = {**HEADERS, **bearer(token), "Origin": ALLOWED_ORIGIN}
    assert httpx.post(f"{server}/mcp", json=listed, headers=good).status_code == 200


@pytest.mark.server
def test_a_tool_call_is_one_audit_record_and_counted_by_tool(
    server: str, make_token: TokenFactory
) -> None:
    token, root = make_token(sub="mcp-auditee", groups=["staff"]), make_token(**ROOT)

    async def use(client: Client) -> Any:
        await client.list_tools()
        return await client.call_tool("search", {"query": QUERY, "top_k": 3})

    result = with_client(server, token, use)
    ids = [h["id"] for h in result.structured_content["results"]]
    records: list[Any] = []
    deadline = time.monotonic() + 5
    while not records and time.monotonic() < deadline:  # the audit writer's tick is 0.2 s
        time.sleep(0.1)
        page = httpx.get(
            f"{server}/admin/audit", params={"subject": "mcp-auditee"}, headers=bearer(root)
        )
        records = page.json()["records"]
    (record,) = records  # the listing and the handshake leave none
    assert record["route"] == "/mcp" and record["tool"] == "search" and record["status"] == 200
    assert record["chunk_ids"] == ids
    metrics = httpx.get(f"{server}/metrics").text
    assert 'gateway_mcp_tool_calls_total{outcome="ok",tool="search"}' in metrics
    assert 'gateway_requests_total{route="/mcp",status="200"}' in metrics


@pytest.mark.server
def test_the_body_limit_holds(server: str, make_token: TokenFactory) -> None:
    huge = rpc("tools/call", {"name": "search", "arguments": {"query": "x" * 100_000}})
    response = httpx.post(
        f"{server}/mcp", json=huge, headers={**HEADERS, **bearer(make_token(**ALICE))}
    )
    assert response.status_code == 413 and response.json()["code"] == "body_too_large"


@pytest.fixture
def limited(
    tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder
) -> Iterator[TestClient]:
    policy = write_policy(
        tmp_path / "policy", limits={"per_subject": {"rate_per_s": 0.01, "burst": 2}}
    )
    with TestClient(create_app(make_settings(data_dir, jwks_file, policy), embedder=embedder)) as c:
        yield c


def test_tool_calls_spend_the_callers_rate_and_nothing_else_does(
    limited: TestClient, make_token: TokenFactory
) -> None:
    token = make_token(**ALICE)
    for _ in range(5):  # listing costs nothing
        assert post(limited, token, rpc("tools/list")).status_code == 200
    assert not call_tool(limited, token, "search", query=QUERY)["isError"]
    assert limited.post("/search", json={"query": QUERY}, headers=bearer(token)).status_code == 200
    refused = post(
        limited, token, rpc("tools/call", {"name": "search", "arguments": {"query": QUERY}}, id=7)
    )
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    body = refused.json()
    assert body["id"] == 7 and body["error"]["message"].startswith("rate_limited")
    metrics = limited.get("/metrics").text
    assert 'gateway_mcp_tool_calls_total{outcome="rate_limited",tool="search"} 1.0' in metrics


def test_a_tool_call_sent_as_a_notification_costs_and_records_nothing(
    limited: TestClient, make_token: TokenFactory
) -> None:
    """A tools/call without a usable `id` is a notification: the SDK answers 202 and runs
    no tool. It spent one of the caller's requests, was counted a `tool_error` and left an
    audit record of a search that never ran."""
    token = make_token(sub="mcp-notifier", groups=["staff"])
    call = rpc("tools/call", {"name": "search", "arguments": {"query": QUERY}})
    without_id = {k: v for k, v in call.items() if k != "id"}
    no_request_id = [{**call, "id": rpc_id} for rpc_id in (None, 1.5, True)]  # SDK: none
    for sent in (without_id, without_id, *no_request_id):  # past the burst of 2
        answered = post(limited, token, sent)
        assert answered.status_code == 202 and not answered.content
    for _ in range(2):  # the burst is 2: both still there
        assert not call_tool(limited, token, "search", query=QUERY)["isError"]
    metrics = limited.get("/metrics").text
    assert 'gateway_mcp_tool_calls_total{outcome="ok",tool="search"} 2.0' in metrics
    assert 'outcome="tool_error"' not in metrics
    state = limited.app.state.gateway  # type: ignore[attr-defined]
    assert state.audit.flush()
    records = state.catalog.audit.find("acme", subject="mcp-notifier")
    assert [(r.route, r.tool, r.status) for r in records] == [("/mcp", "search", 200)] * 2


def test_a_tool_call_the_sdk_cannot_read_costs_and_records_nothing(
    limited: TestClient, make_token: TokenFactory
) -> None:
    """A tools/call the SDK refuses as it parses it (a lone surrogate's escape, which
    Python's `json` reads; no `jsonrpc` member) runs nothing: it must not spend one of
    the caller's requests, count a tool error or leave a record, whatever the door's own
    reading of the body."""
    token = make_token(sub="mcp-unreadable", groups=["staff"])
    call = rpc("tools/call", {"name": "search", "arguments": {"query": "QUERY_HERE"}})
    surrogate = json.dumps(call).replace("QUERY_HERE", "\\ud800").encode()
    auth = {**HEADERS, "Authorization": f"Bearer {token}"}
    for body in (
        surrogate,
        surrogate,
        json.dumps({k: v for k, v in call.items() if k != "jsonrpc"}).encode(),
    ):
        answered = limited.post("/mcp", content=body, headers=auth)
        assert answered.status_code == 400, answered.text
    for _ in range(2):  # the burst is 2: both still there
        assert not call_tool(limited, token, "search", query=QUERY)["isError"]
    assert 'outcome="tool_error"' not in limited.get("/metrics").text
    state = limited.app.state.gateway  # type: ignore[attr-defined]
    assert state.audit.flush()
    records = state.catalog.audit.find("acme", subject="mcp-unreadable")
    assert [(r.route, r.tool, r.status) for r in records] == [("/mcp", "search", 200)] * 2


def test_only_post_and_no_ingest_keys(
    client: TestClient, make_token: TokenFactory, data_dir: Path
) -> None:
    token = make_token(**ALICE)
    got = client.get("/mcp", headers={**HEADERS, **bearer(token)})
    assert got.status_code == 405 and "POST" in got.headers["allow"]
    assert post(client, token, rpc("tools/list")).status_code == 200
    ingest, _ = create_key(
        DataLayout(data_dir).open_catalog(),
        tenant="acme",
        region="EU",
        principals=[],
        scope="ingest",
    )
    refused = post(client, ingest, rpc("tools/list"))
    assert refused.status_code == 403
    assert 'scope="search"' in refused.headers["www-authenticate"]


def test_bad_calls_are_errors_the_model_can_read(
    client: TestClient, make_token: TokenFactory
) -> None:
    token = make_token(**ALICE)
    invalid = call_tool(client, token, "search", query="", top_k=51)
    assert invalid["isError"] is True and "query" in invalid["content"][0]["text"]
    unknown = post(client, token, rpc("tools/call", {"name": "no-such-tool", "arguments": {}}))
    body = unknown.json()
    assert "error" in body or body["result"]["isError"] is True


def test_the_doors_need_a_record_where_the_routes_they_mirror_do() -> None:
    assert record_required("/mcp", ("/search",)) and record_required("/mcp", ("/answer",))
    assert record_required("/mcp", ("/chunks/{chunk_id}",))
    assert record_required("/v1/chat/completions", ("/answer",))
    assert not record_required("/v1/chat/completions", ("/search",))
    assert not record_required("/mcp", ()) and not record_required("/v1/models", ("/answer",))


def test_the_door_counts_every_tool_by_its_name() -> None:
    # /mcp labels a call (audit, metrics) before the SDK is loaded, from its own list.
    from gateway.api.mcp import TOOLS
    from gateway.api.mcp_tools import DESCRIPTIONS

    assert tuple(DESCRIPTIONS) == TOOLS


@pytest.mark.server
def test_no_subscription_stream_is_held_open(server: str, make_token: TokenFactory) -> None:
    """/mcp answers each call in its own response: a `subscriptions/listen` (MCP
    2026-07-28) would otherwise hold a stream open with a ping every 15 s, spending no
    request and leaving no record."""
    listen = rpc(
        "subscriptions/listen",
        {
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
            },
            "notifications": {"toolsListChanged": True},
        },
    )
    headers = {
        **HEADERS,
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "subscriptions/listen",
        **bearer(make_token(**ALICE)),
    }
    with httpx.stream("POST", f"{server}/mcp", json=listen, headers=headers, timeout=10) as got:
        assert not got.headers["content-type"].startswith("text/event-stream")
        body = json.loads(got.read())
    assert "error" in body and "result" not in body


def test_json_nested_past_the_stack_is_a_parse_error_not_a_500(
    client: TestClient, make_token: TokenFactory
) -> None:
    deep = "[" * 30_000 + "]" * 30_000  # under the body limit
    response = client.post("/mcp", content=deep, headers={**HEADERS, **bearer(make_token(**ALICE))})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == -32700
    # Deep enough for our guard, not for Python's parser, which the SDK's newer protocol
    # path reads with: refused here, before it could run a tool past the rate limit.
    call = rpc("tools/call", {"name": "search", "arguments": {"query": QUERY}})
    nested = json.dumps(call)[:-1] + ', "_meta": ' + "[" * 250 + "]" * 250 + "}"
    modern = {**HEADERS, "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call"}
    response = client.post(
        "/mcp", content=nested, headers={**modern, **bearer(make_token(**ALICE))}
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == -32700


def test_a_key_given_twice_is_a_parse_error_and_runs_no_tool(
    client: TestClient, make_token: TokenFactory
) -> None:
    """The SDK's parser keeps the last of two keys: `query` twice searched the second while
    a reader of the body saw the first. As every route refuses such a body, so does /mcp."""
    call = rpc("tools/call", {"name": "search", "arguments": {"query": QUERY}})
    twice = json.dumps(call).replace('"query": ', '"query": "elsewhere", "query": ', 1)
    headers = {**HEADERS, **bearer(make_token(**ALICE))}
    response = client.post("/mcp", content=twice, headers=headers)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == -32700 and "duplicate key 'query'" in error["message"]
    assert "result" not in response.json()


def test_limits_that_cannot_be_read_are_a_503_to_retry_not_a_rate_limit(
    tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    """The limits the processes of `serve --processes N` share, held by another process
    past the wait: the tool call is refused as /search is then (503 `not_ready`,
    Retry-After), not as if the caller had spent its rate."""
    shared = tmp_path / "limits.db"
    policy = write_policy(
        tmp_path / "policy", limits={"per_subject": {"rate_per_s": 100, "burst": 100}}
    )
    settings = make_settings(data_dir, jwks_file, policy)
    with TestClient(create_app(settings, embedder=embedder)) as c:
        c.app.state.gateway.limiter = SharedRateLimiter(shared)  # type: ignore[attr-defined]
        token = make_token(**ALICE)
        holder = sqlite3.connect(shared, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            search = c.post("/search", json={"query": QUERY}, headers=bearer(token))
            called = post(
                c, token, rpc("tools/call", {"name": "search", "arguments": {"query": QUERY}}, id=3)
            )
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        metrics = c.get("/metrics").text
    assert search.status_code == 503 and search.json()["code"] == "not_ready"
    assert called.status_code == 503 and called.headers["retry-after"] == "1"
    assert called.json()["id"] == 3 and called.json()["error"]["message"].startswith("not_ready")
    assert 'gateway_mcp_tool_calls_total{outcome="not_ready",tool="search"} 1.0' in metrics
    assert 'outcome="rate_limited"' not in metrics


def test_a_tool_that_crashes_is_counted_as_a_tool_error(
    tmp_path: Path,
    data_dir: Path,
    jwks_file: Path,
    embedder: Embedder,
    make_token: TokenFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*_: object) -> None:
        raise RuntimeError("the catalog's row could not be decoded")

    monkeypatch.setattr(mcp_tools, "visible_chunk", broken)  # a fault no request can cause
    with TestClient(create_app(make_settings(data_dir, jwks_file), embedder=embedder)) as c:
        result = post(
            c, make_token(**ALICE), rpc("tools/call", {"name": "fetch", "arguments": {"id": "x"}})
        )
        metrics = c.get("/metrics").text
    assert result.status_code == 200 and result.json()["result"]["isError"] is True
    assert "decoded" not in result.text  # the fault's text stays in the server's log
    assert 'gateway_mcp_tool_calls_total{outcome="tool_error",tool="fetch"} 1.0' in metrics
    assert 'outcome="ok",tool="fetch"' not in metrics
