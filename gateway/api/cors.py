"""CORS for the doors a browser page calls itself: /mcp (browser MCP clients) and /v1
(chat apps' "Direct Connections", where each user's browser sends their own token).

Only an `Origin` in GATEWAY_ALLOWED_ORIGINS, compared as /mcp's own check compares it
(without a trailing slash, case-insensitively), gets CORS headers: its preflight is
answered, and every answer, errors included, names it in `Access-Control-Allow-Origin` and
lets the page read the headers a client acts on (a 401's challenge, a 429's wait). Any
other Origin gets none, and the request goes on as it came: /mcp still refuses it 403,
/v1 still serves a client that is not a browser, whatever Origin it sends. Every answer at
these doors, to any Origin or none, carries `Vary: Origin`: a cache must not give one
Origin's answer to a page at another. No credentials mode: the token is a bearer header,
never a cookie. Other routes answer no preflight.
"""

from __future__ import annotations

from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.openai_schemas import is_openai_path
from gateway.api.problems import problem_response
from gateway.errors import GatewayError
from gateway.settings import origin_key

# /mcp answers POST only; GET is allowed here so that a browser MCP client's probe for a
# server stream reads the 405 it expects instead of failing as a network error.
METHODS = ("GET", "POST")
# Those of the MCP transport (a stateless /mcp issues no session, but a client may send
# the headers), the bearer token, and those OpenAI's JS SDK (openai-node) sends with every
# request: its own description (`X-Stainless-*`) and `User-Agent`, which Firefox and
# Safari let a page set. None carries a credential; one list serves both doors.
REQUEST_HEADERS = (
    "Authorization",
    "Content-Type",
    "Mcp-Protocol-Version",
    "Mcp-Session-Id",
    "Last-Event-ID",
    "User-Agent",
    "X-Stainless-Arch",
    "X-Stainless-Helper-Method",
    "X-Stainless-Lang",
    "X-Stainless-OS",
    "X-Stainless-Package-Version",
    "X-Stainless-Retry-Count",
    "X-Stainless-Runtime",
    "X-Stainless-Runtime-Version",
    "X-Stainless-Timeout",
)
EXPOSED_HEADERS = (
    "WWW-Authenticate",
    "Retry-After",
    "Mcp-Session-Id",
    "Gateway-Policy-Version",
)


def is_browser_door(path: str) -> bool:
    return path == "/mcp" or is_openai_path(path)


class BrowserCors(CORSMiddleware):
    """Starlette's CORS middleware, on the browser doors and for the allowed Origins only."""

    def __init__(self, app: ASGIApp, allowed_origins: frozenset[str]) -> None:
        super().__init__(
            app,
            allow_origins=allowed_origins,
            allow_methods=METHODS,
            allow_headers=REQUEST_HEADERS,
            expose_headers=EXPOSED_HEADERS,
        )

    def is_allowed_origin(self, origin: str) -> bool:
        return origin_key(origin) in self.allow_origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_browser_door(scope["path"]):
            await self.app(scope, receive, send)
            return
        origin = Headers(scope=scope).get("origin")
        if origin is None or not self.is_allowed_origin(origin):
            # No CORS headers (/mcp refuses an unlisted Origin itself), but the answer still
            # depends on the Origin: a cache must not give it to a page at a listed one.
            await self.app(scope, receive, vary_on_origin(send))
        elif self._refused_preflight(scope):
            error = GatewayError(
                "forbidden",
                f"a page at this Origin may use the methods {', '.join(METHODS)} and, "
                f"beyond the CORS-safelisted ones, the headers {', '.join(REQUEST_HEADERS)}",
            )
            await problem_response(error, scope["path"])(scope, receive, vary_on_origin(send))
        else:
            await super().__call__(scope, receive, send)  # Starlette adds `Vary: Origin`

    def _refused_preflight(self, scope: Scope) -> bool:
        """A preflight asking for a method or header not allowed here: Starlette would
        answer it in plain text, not as the gateway's problem."""
        headers = Headers(scope=scope)
        if scope["method"] != "OPTIONS" or "access-control-request-method" not in headers:
            return False
        return self.preflight_response(headers).status_code != 200


def vary_on_origin(send: Send) -> Send:
    """`send`, with `Origin` added to the answer's `Vary` (kept with what it names already)."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message.setdefault("headers", [])
            headers = MutableHeaders(scope=message)
            named = [v.strip() for value in headers.getlist("vary") for v in value.split(",")]
            if not any(v.lower() in ("origin", "*") for v in named):
                headers["Vary"] = ", ".join([*filter(None, named), "Origin"])
        await send(message)

    return sending
