"""`/console`: the admins' web page, served as static files from the package.

The page has no powers of its own: it calls the API's routes with the admin's token (pasted,
or obtained from the identity provider by the authorization code flow with PKCE), so the
routes' checks decide everything. The files are public (they hold no data). The
Content-Security-Policy lets the page run only its own script and talk only to this origin
and, when the console signs in there, the issuer's origin; it keeps the page out of frames.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from gateway.errors import GatewayError
from gateway.settings import Settings

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


def content_security_policy(settings: Settings | None) -> str:
    origin = issuer_origin(settings)
    connect = f"'self' {origin}" if origin else "'self'"
    return (
        f"default-src 'none'; script-src 'self'; style-src 'self'; connect-src {connect}; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


def _asset(request: Request, name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise GatewayError("not_found", "no such console file")
    headers = {**HEADERS, "Content-Security-Policy": content_security_policy(_settings(request))}
    return Response((FILES / name).read_bytes(), media_type=media_type, headers=headers)


def _to_the_page() -> Response:
    """A redirect to the page from an address beside it (`/console/`,
    `/console/index.html`), where its relative asset paths would not resolve. Relative, so
    that it stays under whatever path prefix a front proxy serves the gateway at (Starlette's
    own trailing-slash redirect is absolute, built from `Host`, and drops the prefix)."""
    return Response(status_code=308, headers={**HEADERS, "Location": "../console"})


@console.get("/console")
async def console_page(request: Request) -> Response:
    return _asset(request, "index.html")


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
    return _asset(request, "callback.html")


@console.get("/console/{asset}")
async def console_asset(request: Request, asset: str) -> Response:
    if asset == "index.html":
        return _to_the_page()
    return _asset(request, asset)
