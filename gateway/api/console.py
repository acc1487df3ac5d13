"""`/console`: the admins' web page, served as static files from the package.

The page has no powers of its own: it calls the API's routes with the admin's token (pasted,
or obtained from the identity provider by the authorization code flow with PKCE), so the
routes' checks decide everything. The files are public (they hold no data). The
Content-Security-Policy lets the page run only its own script and talk only to this origin
and, when the console signs in there, the issuer's origin and its token endpoint's; it keeps
the page out of frames.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.errors import GatewayError
from gateway.settings import Settings

log = logging.getLogger("gateway.api")
FILES = Path(__file__).resolve().parent.parent / "console"
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "callback.html": "text/html; charset=utf-8",
    "callback.js": "text/javascript; charset=utf-8",
}
HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

console = APIRouter(include_in_schema=False)


def _settings(request: Request) -> Settings | None:
    gateway = getattr(request.app.state, "gateway", None)
    return gateway.settings if gateway is not None else None


def issuer_origin(settings: Settings | None) -> str | None:
    """The issuer's origin when the console signs in there: the one other origin the page
    may call (discovery and the token endpoint). Never wider: no wildcard, no other host."""
    if settings is None or not settings.console_client_id:
        return None
    parts = urlsplit(settings.oidc_issuer)
    return f"{parts.scheme}://{parts.netloc}"


def content_security_policy(settings: Settings | None, token_origin: str | None = None) -> str:
    """The console's policy: its own origin, and where it signs in, the issuer's origin and
    that of the issuer's token endpoint (Google's and Cognito's are on other hosts than
    their issuers: the page's code exchange was blocked, "cannot be reached")."""
    origin = issuer_origin(settings)
    origins = [o for o in dict.fromkeys((origin, token_origin if origin else None)) if o]
    connect = " ".join(["'self'", *origins])
    return (
        f"default-src 'none'; script-src 'self'; style-src 'self'; connect-src {connect}; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


class TokenEndpointOrigin:
    """The origin of the issuer's token endpoint, from its discovery document: looked up
    when the console is first served, then at most every TOKEN_ORIGIN_TTL_S; None while
    unknown (the page then may talk to the issuer's origin only, as before)."""

    def __init__(self) -> None:
        self._known: tuple[float, str | None] | None = None
        # Many first page loads at once share one lookup: each would fetch the document.
        self._looking_up = asyncio.Lock()

    def _fresh(self) -> tuple[float, str | None] | None:
        known = self._known
        if known is not None and time.monotonic() - known[0] < TOKEN_ORIGIN_TTL_S:
            return known
        return None

    async def get(self, gateway: Any) -> str | None:
        if (known := self._fresh()) is not None:
            return known[1]
        async with self._looking_up:
            if (known := self._fresh()) is not None:  # looked up while this one waited
                return known[1]
            return await self._look_up(gateway)

    async def _look_up(self, gateway: Any) -> str | None:
        origin = None
        try:
            endpoint = (await gateway.verifier.discovery_document()).get("token_endpoint")
            parts = urlsplit(endpoint) if isinstance(endpoint, str) else None
            if parts is not None and parts.scheme == "https" and parts.netloc:
                origin = f"https://{parts.netloc}"
        except Exception as exc:  # the page still loads; signing in may fail, and say so
            log.warning("the issuer's token endpoint is unknown (%s)", type(exc).__name__)
        # Unknown, it is asked again sooner: a provider down for a moment must not keep a
        # sign-in blocked for the whole TTL.
        ttl = TOKEN_ORIGIN_TTL_S if origin is not None else UNKNOWN_ORIGIN_TTL_S
        self._known = (time.monotonic() - TOKEN_ORIGIN_TTL_S + ttl, origin)
        return origin


TOKEN_ORIGIN_TTL_S = 600.0
UNKNOWN_ORIGIN_TTL_S = 30.0


async def _asset(request: Request, name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise GatewayError("not_found", "no such console file")
    settings, gateway = _settings(request), getattr(request.app.state, "gateway", None)
    token_origin = None
    page = media_type.startswith("text/html")  # a page's policy governs its scripts' calls
    if page and issuer_origin(settings) is not None and gateway is not None:
        state = request.app.state  # one lookup per app: each app has its own issuer
        if getattr(state, "console_token_origin", None) is None:
            state.console_token_origin = TokenEndpointOrigin()
        token_origin = await state.console_token_origin.get(gateway)
    policy = content_security_policy(settings, token_origin)
    headers = {**HEADERS, "Content-Security-Policy": policy}
    return Response((FILES / name).read_bytes(), media_type=media_type, headers=headers)


def _to_the_page() -> Response:
    """A redirect to the page from an address beside it (`/console/`,
    `/console/index.html`), where its relative asset paths would not resolve. Relative, so
    that it stays under whatever path prefix a front proxy serves the gateway at (Starlette's
    own trailing-slash redirect is absolute, built from `Host`, and drops the prefix)."""
    return Response(status_code=308, headers={**HEADERS, "Location": "../console"})


@console.get("/console")
async def console_page(request: Request) -> Response:
    return await _asset(request, "index.html")


@console.get("/console/")
async def console_directory() -> Response:
    return _to_the_page()


@console.get("/console/sign-in.json")
async def console_sign_in(request: Request) -> JSONResponse:
    """Where the page signs in: the issuer, the console's public client and its scope;
    `{"issuer": null}` when the console takes pasted tokens only."""
    settings = _settings(request)
    body: dict[str, Any] = {"issuer": None, "client_id": None, "scope": None}
    if settings is not None and settings.console_client_id:
        body = {
            "issuer": settings.oidc_issuer,
            "client_id": settings.console_client_id,
            "scope": settings.console_scope,
        }
    return JSONResponse(body, headers=HEADERS)


@console.get("/console/callback")
async def console_callback(request: Request) -> Response:
    """The redirect URI: hands the code to the console's window and closes."""
    return await _asset(request, "callback.html")


@console.get("/console/{asset}")
async def console_asset(request: Request, asset: str) -> Response:
    if asset == "index.html":
        return _to_the_page()
    return await _asset(request, asset)
