"""CORS at the doors a browser page calls itself, /mcp and /v1 ("Direct Connections"):
a page at an Origin in GATEWAY_ALLOWED_ORIGINS gets its preflights answered and may read
every answer, errors included (a 401's challenge, a 429's wait); any other Origin gets no
CORS headers, /mcp still refuses it, and /v1 still serves clients that are not browsers.
Through the test client, then through Chromium against a real `gateway serve`."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.responses import PlainTextResponse
from starlette.types import Receive, Scope, Send

from gateway.api.app import create_app
from gateway.api.cors import BrowserCors
from gateway.bench.server import free_port
from gateway.embedding import Embedder
from tests.helpers.browser import chromium
from tests.helpers.callers import ALICE
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.mcp import HEADERS, rpc
from tests.helpers.policies import write_policy
from tests.helpers.processes import running_server, served_env

CHAT = "https://chat.example"
AGENT = "https://agent.example"
EVIL = "https://evil.example"
QUERY = "How quickly are refunds paid?"
ASKED_HEADERS = "authorization,content-type,mcp-protocol-version"


@pytest.fixture(scope="module")
def cors_app(
    tmp_path_factory: pytest.TempPathFactory, data_dir: Path, jwks_file: Path, embedder: Embedder
) -> Iterator[TestClient]:
    policy = write_policy(  # each test's caller is its own subject, with a bucket of its own
        tmp_path_factory.mktemp("cors-policy"),
        limits={"per_subject": {"rate_per_s": 0.01, "burst": 2}},
    )
    settings = make_settings(data_dir, jwks_file, policy).model_copy(
        # listed as an operator might write them: a trailing slash, capitals, spaces
        update={"allowed_origins": f"{CHAT}/, HTTPS://Agent.Example", "public_url": "http://gw"}
    )
    with TestClient(create_app(settings, embedder=embedder)) as client:
        yield client


def preflight(client: TestClient, path: str, origin: str, method: str = "POST") -> Any:
    return client.options(
        path,
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": ASKED_HEADERS,
        },
    )


def cors_headers(response: Any) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.startswith("access-control-")}


def readable(response: Any, origin: str) -> set[str]:
    """The response headers a page at `origin` may read, beyond the safelisted ones: none
    unless the answer names that Origin."""
    assert response.headers.get("access-control-allow-origin") == origin
    assert "Origin" in response.headers["vary"]
    assert "access-control-allow-credentials" not in response.headers  # bearer tokens only
    exposed = response.headers["access-control-expose-headers"]
    return {h.strip().lower() for h in exposed.split(",")}


@pytest.mark.parametrize(
    ("path", "origin", "method"),
    [("/mcp", AGENT, "POST"), ("/v1/models", CHAT, "GET"), ("/v1/chat/completions", CHAT, "POST")],
)
def test_a_listed_origins_preflight_is_answered(
    cors_app: TestClient, path: str, origin: str, method: str
) -> None:
    answered = preflight(cors_app, path, origin, method)
    assert answered.status_code == 200
    assert answered.headers["access-control-allow-origin"] == origin
    assert method in answered.headers["access-control-allow-methods"]
    allowed = answered.headers["access-control-allow-headers"].lower()
    assert all(h in allowed for h in ASKED_HEADERS.split(","))
    assert "access-control-allow-credentials" not in answered.headers


def test_a_page_at_a_listed_origin_reads_mcp_answers_and_errors(
    cors_app: TestClient, make_token: TokenFactory
) -> None:
    origin = {**HEADERS, "Origin": AGENT}
    listed = cors_app.post(
        "/mcp", json=rpc("tools/list"), headers={**origin, **bearer(make_token(**ALICE))}
    )
    assert listed.status_code == 200 and len(listed.json()["result"]["tools"]) == 3
    assert "www-authenticate" in readable(listed, AGENT)

    unsigned = cors_app.post("/mcp", json=rpc("tools/list"), headers=origin)
    assert unsigned.status_code == 401
    assert "www-authenticate" in readable(unsigned, AGENT)
    assert "resource_metadata=" in unsigned.headers["www-authenticate"]

    # a token got by OAuth for the MCP resource without the scope `search`
    unscoped = make_token(**ALICE, aud="http://gw/mcp")
    lacking = cors_app.post("/mcp", json=rpc("tools/list"), headers={**origin, **bearer(unscoped)})
    assert lacking.status_code == 403 and "www-authenticate" in readable(lacking, AGENT)
    assert 'error="insufficient_scope"' in lacking.headers["www-authenticate"]

    token = make_token(sub="cors-limited")  # a bucket of its own: two calls, then 429
    call = rpc("tools/call", {"name": "search", "arguments": {"query": QUERY}})
    statuses = [
        cors_app.post("/mcp", json=call, headers={**origin, **bearer(token)}) for _ in range(3)
    ]
    assert [s.status_code for s in statuses] == [200, 200, 429]
    assert "retry-after" in readable(statuses[2], AGENT)
    assert int(statuses[2].headers["retry-after"]) >= 1


def test_a_page_at_a_listed_origin_reads_v1_answers_and_errors(
    cors_app: TestClient, make_token: TokenFactory
) -> None:
    models = cors_app.get("/v1/models", headers={"Origin": CHAT, **bearer(make_token(sub="v1"))})
    assert models.status_code == 200 and models.json()["data"][0]["id"] == "gateway"
    readable(models, CHAT)
    unsigned = cors_app.get("/v1/models", headers={"Origin": CHAT})
    assert unsigned.status_code == 401
    assert "www-authenticate" in readable(unsigned, CHAT)
    posted = cors_app.post("/v1/chat/completions", json={}, headers={"Origin": CHAT})
    assert posted.status_code == 401 and "www-authenticate" in readable(posted, CHAT)


def test_an_unlisted_origin_gets_no_cors_and_mcp_still_refuses_it(
    cors_app: TestClient, make_token: TokenFactory
) -> None:
    token = bearer(make_token(sub="unlisted"))
    for path in ("/mcp", "/v1/models"):
        refused = preflight(cors_app, path, EVIL)
        assert refused.status_code == 405 and cors_headers(refused) == {}
    at_mcp = cors_app.post(
        "/mcp", json=rpc("tools/list"), headers={**HEADERS, **token, "Origin": EVIL}
    )
    assert at_mcp.status_code == 403 and cors_headers(at_mcp) == {}
    # /v1 serves it as before (a server-side client may send any Origin); no page may read it
    at_v1 = cors_app.get("/v1/models", headers={**token, "Origin": EVIL})
    assert at_v1.status_code == 200 and cors_headers(at_v1) == {}
    without = cors_app.get("/v1/models", headers=token)
    assert without.status_code == 200 and cors_headers(without) == {}


def test_other_routes_answer_no_preflight_even_for_a_listed_origin(
    cors_app: TestClient, make_token: TokenFactory
) -> None:
    for path in ("/search", "/answer", "/admin/audit", "/scim/v2/Users"):
        refused = preflight(cors_app, path, CHAT)
        assert refused.status_code == 405 and cors_headers(refused) == {}
    searched = cors_app.post(
        "/search",
        json={"query": QUERY},
        headers={"Origin": CHAT, **bearer(make_token(sub="other"))},
    )
    assert searched.status_code == 200 and cors_headers(searched) == {}


# What OpenAI's JS SDK (openai-node) sends from a page besides the token and the body's
# type: its description of itself, and the User-Agent that Firefox and Safari let it set.
OPENAI_NODE_HEADERS = (
    "authorization,content-type,user-agent,x-stainless-arch,x-stainless-helper-method,"
    "x-stainless-lang,x-stainless-os,x-stainless-package-version,x-stainless-retry-count,"
    "x-stainless-runtime,x-stainless-runtime-version,x-stainless-timeout"
)


@pytest.mark.parametrize(
    ("path", "method"), [("/v1/chat/completions", "POST"), ("/v1/models", "GET")]
)
def test_openai_js_sdk_preflights_from_a_listed_origin_are_answered(
    cors_app: TestClient, path: str, method: str
) -> None:
    answered = cors_app.options(
        path,
        headers={
            "Origin": CHAT,
            "Access-Control-Request-Method": method,
            "Access-Control-Request-Headers": OPENAI_NODE_HEADERS,
        },
    )
    assert answered.status_code == 200, answered.text
    assert answered.headers["access-control-allow-origin"] == CHAT
    allowed = {h.strip() for h in answered.headers["access-control-allow-headers"].split(",")}
    assert set(OPENAI_NODE_HEADERS.split(",")) <= {h.lower() for h in allowed}


def test_a_preflight_asking_for_more_is_refused_as_a_problem(cors_app: TestClient) -> None:
    for method, headers in (("PUT", "content-type"), ("POST", "x-custom")):
        refused = cors_app.options(
            "/mcp",
            headers={
                "Origin": AGENT,
                "Access-Control-Request-Method": method,
                "Access-Control-Request-Headers": headers,
            },
        )
        assert refused.status_code == 403
        assert refused.headers["content-type"] == "application/problem+json"
        assert "Authorization" in refused.json()["detail"]


def varies_on_origin(response: Any) -> bool:
    return "origin" in {v.strip().lower() for v in response.headers.get("vary", "").split(",")}


def test_every_answer_at_a_browser_door_varies_on_origin(
    cors_app: TestClient, make_token: TokenFactory
) -> None:
    """Whether an answer at /mcp or /v1 names the Origin, or is refused for it, depends on
    the Origin, so each says so in `Vary`: a cache in front of the gateway must not give a
    page at a listed Origin an answer stored for another Origin (or none), which the
    browser would then withhold from the page, nor the other way round."""
    refused = cors_app.options(
        "/mcp", headers={"Origin": AGENT, "Access-Control-Request-Method": "PUT"}
    )
    answers = {
        "preflight, listed": preflight(cors_app, "/mcp", AGENT),
        "preflight, asking for more": refused,
        "preflight, unlisted": preflight(cors_app, "/mcp", EVIL),
        # a browser MCP client's probe for a server stream: a 405 any cache may keep
        "probe, listed": cors_app.get("/mcp", headers={"Origin": AGENT}),
        "probe, unlisted": cors_app.get("/mcp", headers={"Origin": EVIL}),
        "probe, no Origin": cors_app.get("/mcp"),
        "mcp, unlisted": cors_app.post(
            "/mcp", json=rpc("tools/list"), headers={**HEADERS, "Origin": EVIL}
        ),
        "mcp, no Origin": cors_app.post(
            "/mcp",
            json=rpc("tools/list"),
            headers={**HEADERS, **bearer(make_token(sub="vary-mcp"))},
        ),
    }
    for name, origin in (("listed", CHAT), ("unlisted", EVIL), ("no Origin", None)):
        headers = bearer(make_token(sub=f"vary-{origin}"))
        if origin is not None:
            headers["Origin"] = origin
        answers[f"v1, {name}"] = cors_app.get("/v1/models", headers=headers)
    statuses = {name: answer.status_code for name, answer in answers.items()}
    assert statuses == {
        "preflight, listed": 200,
        "preflight, asking for more": 403,
        "preflight, unlisted": 405,
        "probe, listed": 405,
        "probe, unlisted": 405,
        "probe, no Origin": 405,
        "mcp, unlisted": 403,
        "mcp, no Origin": 200,
        "v1, listed": 200,
        "v1, unlisted": 200,
        "v1, no Origin": 200,
    }
    assert [name for name, answer in answers.items() if not varies_on_origin(answer)] == []
    assert answers["probe, listed"].headers["access-control-allow-origin"] == AGENT
    assert cors_headers(answers["probe, unlisted"]) == {} == cors_headers(answers["v1, no Origin"])
    # a route no page may call answers the same to every Origin: nothing to vary on
    assert not varies_on_origin(cors_app.get("/healthz", headers={"Origin": CHAT}))


def test_vary_keeps_what_the_answer_varies_on_already() -> None:
    async def varies_on_encoding(scope: Scope, receive: Receive, send: Send) -> None:
        answer = PlainTextResponse("ok", headers={"Vary": "Accept-Encoding"})
        await answer(scope, receive, send)

    cors = BrowserCors(varies_on_encoding, allowed_origins=frozenset({CHAT}))
    client = TestClient(cors)  # no lifespan: the bare app above has none
    for origin in (CHAT, EVIL, None):
        headers = {} if origin is None else {"Origin": origin}
        vary = client.get("/v1/models", headers=headers).headers.get_list("vary")
        assert [v.strip() for v in ",".join(vary).split(",")] == ["Accept-Encoding", "Origin"]


def test_the_allowed_origins_are_read_once_and_follow_a_copy_of_the_settings(
    tmp_path: Path, jwks_file: Path
) -> None:
    """/mcp looks every request's Origin up in the set: it is built once, not per request,
    and a copy of the settings with other origins has its own."""
    settings = make_settings(tmp_path, jwks_file).model_copy(
        update={"allowed_origins": f"{CHAT}/, HTTPS://Agent.Example"}
    )
    listed = settings.allowed_origin_set
    assert listed == {CHAT, AGENT} and settings.allowed_origin_set is listed
    other = settings.model_copy(update={"allowed_origins": EVIL})
    assert other.allowed_origin_set == {EVIL} and settings.allowed_origin_set == {CHAT, AGENT}


# In the page: the gateway's answers as a script at the page's Origin may read them.
FETCHES = """async ([base, token]) => {
    const auth = {Authorization: `Bearer ${token}`};
    const models = await fetch(`${base}/v1/models`, {headers: auth});
    const mcp = (headers) => fetch(`${base}/mcp`, {
        method: "POST",
        headers: {...headers, "Content-Type": "application/json",
                  "Accept": "application/json, text/event-stream",
                  "MCP-Protocol-Version": "2025-06-18"},
        body: JSON.stringify({jsonrpc: "2.0", id: 1, method: "tools/list", params: {}}),
    });
    const listed = await mcp(auth);
    const unsigned = await mcp({});
    return {
        models: (await models.json()).data.map((m) => m.id),
        tools: (await listed.json()).result.tools.map((t) => t.name).sort(),
        unsigned: unsigned.status,
        challenge: unsigned.headers.get("WWW-Authenticate"),
    };
}"""
REFUSED = """async (base) => {
    try { await fetch(`${base}/v1/models`); return "read"; }
    catch (error) { return error.name; }
}"""


class BlankPage(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<!doctype html><title>a chat app</title>")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.server
def test_a_page_at_a_listed_origin_calls_v1_and_mcp_from_chromium(
    data_dir: Path, jwks_file: Path, make_token: TokenFactory
) -> None:
    with chromium() as browser:  # skips, saying why, where Chromium or Playwright is missing
        pages = http.server.ThreadingHTTPServer(("127.0.0.1", 0), BlankPage)
        threading.Thread(target=pages.serve_forever, daemon=True).start()
        page_port = pages.server_address[1]
        listed = f"http://127.0.0.1:{page_port}"
        port = free_port()
        env = served_env(
            data_dir,
            jwks_file,
            GATEWAY_PUBLIC_URL=f"http://127.0.0.1:{port}",
            GATEWAY_ALLOWED_ORIGINS=listed,
        )
        try:
            with running_server(env, port=port) as (base, _process):
                context = browser.new_context()
                page = context.new_page()
                page.goto(f"{listed}/")
                seen = page.evaluate(FETCHES, [base, make_token(**ALICE)])
                # the same page's server under another name is another Origin, not listed
                page.goto(f"http://localhost:{page_port}/")
                refused = page.evaluate(REFUSED, base)
                context.close()
        finally:
            pages.shutdown()
            pages.server_close()
    assert seen == {
        "models": ["gateway"],
        "tools": ["answer", "fetch", "search"],
        "unsigned": 401,
        "challenge": f'Bearer resource_metadata="{base}/.well-known/oauth-protected-resource/mcp"',
    }
    assert refused == "TypeError"  # the browser withheld the answer: no CORS headers
