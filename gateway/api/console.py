"""`/console`: the admins' web page, served as static files from the package.

The page has no powers of its own: it calls the API's routes with the token an admin
pastes, so the routes' checks decide everything. The files are public (they hold no
data). The Content-Security-Policy lets the page run only its own script and talk only
to this origin, and keeps it out of frames.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import Response

from gateway.errors import GatewayError

FILES = Path(__file__).resolve().parent.parent / "console"
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

console = APIRouter(include_in_schema=False)


def _asset(name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise GatewayError("not_found", "no such console file")
    return Response((FILES / name).read_bytes(), media_type=media_type, headers=HEADERS)


@console.get("/console")
async def console_page() -> Response:
    return _asset("index.html")


@console.get("/console/{asset}")
async def console_asset(asset: str) -> Response:
    return _asset(asset)
