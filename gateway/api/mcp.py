"""/mcp: the official MCP SDK's Streamable HTTP transport (stateless, JSON responses),
behind the gateway's own Origin check, authentication, audit record and rate limits.

In front of the SDK, in order: an `Origin` not in GATEWAY_ALLOWED_ORIGINS is 403 (DNS
rebinding: a web page must not reach a gateway on the user's network); the bearer token or
key is authenticated as at /search, a JWT's `aud` may also be the MCP resource
(<GATEWAY_PUBLIC_URL>/mcp, RFC 8707), and without valid credentials the answer is 401 with
the challenge MCP clients follow (`resource_metadata`, RFC 9728); a caller lacking the
scope is refused 403, on record as at /search; then a `tools/call` (a request, not a
notification), and only that, is recorded (route /mcp, the tool) and spends one of the
caller's requests. The SDK's own auth is not used: it would challenge with `error=` when
no token was sent, answer in its own shape, and know one audience only.

The SDK is imported and its server built at the first request that reaches it (about
half a second of CPU a process that nobody calls by MCP never spends); its session manager
then runs until the app stops (`McpDoor`, closed in the lifespan). The Starlette app the
SDK builds around it is not mounted, since a mounted app's lifespan never runs. The `mcp`
SDK is imported in `_build` and in gateway.api.mcp_tools only.

A tool's error reaches the client as a 200 (a JSON-RPC result with `isError`); its audit
record carries the status the route it mirrors would have answered (`RECORDED_STATUS`).
`/mcp/` is served as `/mcp` (`McpSlash`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from contextvars import Context
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.problems import problem_response
from gateway.api.security import admit, authenticate, bearer, state_of
from gateway.authn.devissuer import resolve_identity
from gateway.errors import GatewayError
from gateway.ingest.parse import strict_object
from gateway.jsonbody import loads
from gateway.settings import Settings, origin_key
from gateway.telemetry.audit import current_facts, note

METADATA_PATH = "/.well-known/oauth-protected-resource"
# The one scope /mcp's tools need (docs/security.md, "OAuth for MCP clients"); the RFC 9728
# document lists it in scopes_supported.
MCP_SCOPE = "search"
INSUFFICIENT_SCOPE = f'error="insufficient_scope", scope="{MCP_SCOPE}"'
RESOURCE_NAME = "Permission-aware RAG gateway"


TOOLS = ("search", "fetch", "answer")  # as gateway.api.mcp_tools.DESCRIPTIONS names them
# The ASGI scope key where a tool call leaves the status its audit record carries
# (gateway.api.audit reads it): a tool's error is a 200 to the client, JSON-RPC's way,
# but the record says what /search, /documents, /chunks or /answer would have answered.
RECORDED_STATUS = "gateway.recorded_status"
# Until a tool runs: a call the SDK refuses before running one (invalid arguments, an
# unknown tool: JSON-RPC's "invalid params") is what /search answers 422.
REFUSED_CALL_STATUS = 422


class McpDoor:
    """One app's MCP server, built by the first request that reaches it; its session
    manager may run once, so one door per app start."""

    def __init__(self) -> None:
        self._server: Any = None
        self._building = asyncio.Lock()
        self._running: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._closed = False

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = await self._started()
        await server.session_manager.handle_request(scope, receive, send)

    async def _started(self) -> Any:
        async with self._building:
            if self._closed:
                raise GatewayError("not_ready", "stopping")
            if self._server is None:
                server = await asyncio.to_thread(_build)  # imports: off the event loop
                up = asyncio.Event()
                # A context of its own: the manager outlives the request that started it,
                # whose audit facts and trace must not follow it.
                running = asyncio.create_task(self._run(server, up), context=Context())
                waiting = asyncio.create_task(up.wait())
                try:
                    await asyncio.wait({waiting, running}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiting.cancel()
                    if not up.is_set():  # failed, or this request was cancelled meanwhile
                        running.cancel()
                if not up.is_set():
                    running.result()  # raises why the session manager did not start
                self._server, self._running = server, running
        return self._server

    async def _run(self, server: Any, up: asyncio.Event) -> None:
        async with server.session_manager.run():
            up.set()
            await self._stop.wait()

    @asynccontextmanager
    async def open(self) -> AsyncIterator[McpDoor]:
        """The door for the app's life; on leaving, tool calls stop before the rest closes."""
        try:
            yield self
        finally:
            async with self._building:
                self._closed = True
            self._stop.set()
            if self._running is not None:
                await self._running


def _build() -> Any:
    from mcp.server.transport_security import TransportSecuritySettings

    from gateway.api.mcp_tools import add_tools, new_server

    # The SDK's constructor calls logging.basicConfig: the process's logging is not the
    # SDK's to set, so the root logger is put back as it was.
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    server = new_server()
    root.setLevel(level)
    root.handlers[:] = handlers
    # Its INFO lines on failed calls quote the arguments (pydantic's input_value): a query
    # must not reach the log, as everywhere else.
    logging.getLogger("mcp").setLevel(logging.WARNING)
    add_tools(server)
    # Called for the session manager it makes. Host checks are off: the SDK's default allows
    # only loopback Host headers; the Origin check here is the defence.
    server.streamable_http_app(
        stateless_http=True,
        json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    return server


def base_url(settings: Settings, request: Request) -> str:
    return settings.public_url or str(request.base_url).rstrip("/")


def mcp_audiences(settings: Settings) -> tuple[str, ...]:
    """Never from the request's Host: a token minted for another server's /mcp would
    pass by naming that server's host."""
    return (settings.mcp_resource,) if settings.mcp_resource else ()


def _granted_scopes(claims: dict[str, Any]) -> set[str]:
    """RFC 9068's `scope` (space-separated); `scp` as Entra (a string) and Okta (a list)
    write it."""
    granted: set[str] = set()
    for name in ("scope", "scp"):
        value = claims.get(name)
        if isinstance(value, str):
            granted.update(value.split())
        elif isinstance(value, list):
            granted.update(v for v in value if isinstance(v, str))
    return granted


def _lacking_scope(request: Request, settings: Settings, key_scope: str) -> str | None:
    """Why the caller may not use /mcp's tools (403 insufficient_scope), or None. A token
    issued for the MCP resource alone (RFC 8707: `aud` is <public URL>/mcp, not
    OIDC_AUDIENCE) must carry the scope `search`; a token for the gateway's audience is
    not limited by scope, as at /search; an API key needs the `search` scope."""
    if key_scope == "ingest":
        return "an ingest key may use only the ingest routes; /mcp needs the scope 'search'"
    claims: dict[str, Any] | None = getattr(request.state, "token_claims", None)
    if claims is None:
        return None
    aud = claims.get("aud")
    audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
    if settings.oidc_audience in audiences or MCP_SCOPE in _granted_scopes(claims):
        return None
    return f"this token, issued for the MCP resource, lacks the scope {MCP_SCOPE!r}"


def challenge(base: str, token_sent: bool) -> str:
    value = f'Bearer resource_metadata="{base}{METADATA_PATH}/mcp"'
    return value + ', error="invalid_token"' if token_sent else value


class McpEndpoint:
    """The ASGI app of the route /mcp (POST only: Starlette answers other methods 405)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        gateway = getattr(request.app.state, "gateway", None)
        if gateway is None:
            await _problem(scope, receive, send, GatewayError("not_ready", "starting"))
            return
        settings: Settings = gateway.settings
        origin = request.headers.get("origin")
        if origin is not None and origin_key(origin) not in settings.allowed_origin_set:
            error = GatewayError("forbidden", "this Origin may not call /mcp")
            await _problem(scope, receive, send, error)
            return
        credentials = await bearer(request)
        try:
            caller = await authenticate(request, credentials, mcp_audiences(settings))
        except GatewayError as exc:
            if exc.code == "unauthenticated":
                sent = request.headers.get("authorization") is not None
                www = challenge(base_url(settings, request), sent)
                exc = GatewayError(exc.code, exc.detail, headers={"WWW-Authenticate": www})
            await _problem(scope, receive, send, exc)
            return
        # The audience tokens are checked against: the dev issuer's, where it is on.
        lacking = _lacking_scope(request, resolve_identity(settings), caller.scope)
        if lacking is not None:
            # A verified caller refused: on record with its 403, as /search records it,
            # under the policy that resolved it (kept on the request by `authenticate`).
            version = request.state.policy.version
            note(subject=caller.subject, tenant=caller.tenant, policy_version=version)
            www = f"{challenge(base_url(settings, request), False)}, {INSUFFICIENT_SCOPE}"
            error = GatewayError("forbidden", lacking, headers={"WWW-Authenticate": www})
            await _problem(scope, receive, send, error)
            return
        request.state.caller = caller
        messages = await _body(receive)
        unreadable = _unreadable(_raw(messages))
        if unreadable is not None:
            await _parse_error(scope, receive, send, unreadable)
            return
        called, rpc_id = _tool_called(messages)
        if called is not None:
            label = called if called in TOOLS else "other"
            note(tool=label)
            try:
                admit(request, caller)
            except GatewayError as exc:  # a limit, or the shared limits unreadable (503)
                gateway.metrics.mcp_tool_calls.labels(label, exc.code).inc()
                await _refused(scope, receive, send, exc, rpc_id)
                return
            scope[RECORDED_STATUS] = REFUSED_CALL_STATUS  # the tool, once run, says its own
        # The tools run in the SDK's tasks: they record into this request's facts.
        request.state.audit_facts = current_facts()
        door = state_of(request).mcp
        assert door is not None  # set with the gateway state, in the lifespan
        try:
            await door.handle(scope, _replay(messages, receive), send)
        except GatewayError as exc:  # the app is stopping
            await _problem(scope, receive, send, exc)
            return
        if called is not None and scope.get(RECORDED_STATUS) == REFUSED_CALL_STATUS:
            # The SDK refused the call before any tool ran (its arguments invalid, or no
            # such tool): the tool's own wrapper, which counts the others, never ran.
            gateway.metrics.mcp_tool_calls.labels(label, "tool_error").inc()


async def _body(receive: Receive) -> list[Message]:
    """The body's messages (RequestGuard has bounded it already)."""
    messages: list[Message] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            return messages


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()  # then the client's disconnect

    return replayed


def _tool_called(messages: list[Message]) -> tuple[str | None, Any]:
    """(tool name, JSON-RPC id) of a tools/call; (None, None) for anything else, which the
    SDK answers itself. Read as the SDK reads it, with its parser and its message types:
    what it refuses (a lone surrogate's escape, which Python's `json` takes; a message
    without `jsonrpc`) or takes for a notification (no `id`, or a null, fractional or
    boolean one: answered 202, nothing run) costs and records nothing."""
    import pydantic_core  # here: the SDK's types are imported at the first MCP request
    from mcp_types import JSONRPCRequest, jsonrpc_message_adapter

    try:
        # Nested too deeply: refused before this.
        raw = pydantic_core.from_json(_raw(messages))
        message = jsonrpc_message_adapter.validate_python(raw, by_name=False)
    except ValueError:  # pydantic's ValidationError is one
        return None, None
    if not isinstance(message, JSONRPCRequest) or message.method != "tools/call":
        return None, None
    params = message.params or {}
    name = params.get("name")
    return (name if isinstance(name, str) else ""), message.id


def _raw(messages: list[Message]) -> bytes:
    return b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")


def _unreadable(raw: bytes) -> str | None:
    """Why a body is refused here, before the SDK parses it, or None: nested too deeply
    (the SDK's newer path would parse it, past the rate limit), or giving a key twice (the
    SDK's parser keeps the last: `"query"` twice in a tool's arguments searched the
    second, while a reader of the body saw the first; every route refuses it). A body
    that is not JSON at all is the SDK's to answer, as before."""
    try:
        loads(raw, object_pairs_hook=strict_object)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    except ValueError as exc:  # TOO_DEEP, or strict_object's: the key's name, never a value
        return str(exc)
    return None


async def _parse_error(scope: Scope, receive: Receive, send: Send, why: str) -> None:
    """JSON-RPC's parse error, as the SDK answers a body it cannot read."""
    await _rpc_error(scope, receive, send, None, -32700, f"Parse error: {why}", 400)


async def _rpc_error(
    scope: Scope,
    receive: Receive,
    send: Send,
    rpc_id: Any,
    code: int,
    message: str,
    status: int,
    headers: Mapping[str, str] | None = None,
) -> None:
    """A JSON-RPC error body with an HTTP status: MCP clients show a JSON body's
    message, and would show a problem+json body only as 'an error response'."""
    body = {"jsonrpc": "2.0", "id": rpc_id, "error": {"code": code, "message": message}}
    await JSONResponse(body, status_code=status, headers=headers)(scope, receive, send)


async def _problem(scope: Scope, receive: Receive, send: Send, error: GatewayError) -> None:
    await problem_response(error)(scope, receive, send)


async def _refused(
    scope: Scope, receive: Receive, send: Send, error: GatewayError, rpc_id: Any
) -> None:
    """The limiter's refusal (429 `rate_limited`, or 503 `not_ready` when the limits a
    host's processes share cannot be read), with its status and headers (Retry-After)."""
    message = f"{error.code}: {error.detail or error.title}"
    await _rpc_error(scope, receive, send, rpc_id, -32000, message, error.status, error.headers)


class McpSlash:
    """Serves `POST /mcp/` as `/mcp`. MCP clients are configured with either URL, and the
    router's answer to the other was no MCP answer: without credentials the generic 401,
    lacking the challenge that tells a client where to get a token; with them, an
    unrecorded 307 to /mcp. Installed outermost, so the metrics, the audit record, the
    body limit and the authentication all see /mcp (one route, one challenge, one record)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/mcp/":
            scope = {**scope, "path": "/mcp", "raw_path": b"/mcp"}
        await self.app(scope, receive, send)


class ProtectedResource(BaseModel):
    resource: str = Field(description="<GATEWAY_PUBLIC_URL>/mcp: an accepted `aud` there")
    authorization_servers: list[str] | None = Field(
        default=None, description="GATEWAY_OIDC_ISSUER; absent when none is configured"
    )
    bearer_methods_supported: list[str]
    scopes_supported: list[str]
    resource_name: str


wellknown = APIRouter()


@wellknown.get(f"{METADATA_PATH}/mcp", response_model=ProtectedResource)
@wellknown.get(METADATA_PATH, response_model=ProtectedResource, include_in_schema=False)
async def protected_resource(request: Request) -> JSONResponse:
    """OAuth 2.0 Protected Resource Metadata (RFC 9728) of /mcp: the resource and the
    issuer whose tokens it takes. Public: it is how an MCP client finds where to sign in."""
    settings = state_of(request).settings
    document: dict[str, Any] = {
        "resource": f"{base_url(settings, request)}/mcp",
        "bearer_methods_supported": ["header"],
        "scopes_supported": [MCP_SCOPE],
        "resource_name": RESOURCE_NAME,
    }
    if settings.oidc_issuer:  # API keys only: no issuer to name
        document["authorization_servers"] = [settings.oidc_issuer]
    return JSONResponse(document, headers={"Access-Control-Allow-Origin": "*"})
