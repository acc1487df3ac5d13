"""Errors under /scim/v2 in SCIM's own shape (RFC 7644 s3.12), whatever raised them: the
routes' refusals (`scim_error`), authentication, rate limits, the catalog being away, an
unknown path (404) or a method a route does not allow (405, keeping `Allow`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi.responses import JSONResponse

from gateway.errors import GatewayError

SCIM_JSON = "application/scim+json"
SCIM_ERROR = "urn:ietf:params:scim:api:messages:2.0:Error"


def is_scim_path(path: str) -> bool:
    return path == "/scim/v2" or path.startswith("/scim/v2/")


def scim_body(status: int, detail: str, scim_type: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"schemas": [SCIM_ERROR], "status": str(status), "detail": detail}
    if scim_type is not None:
        body["scimType"] = scim_type
    return body


def scim_problem(error: GatewayError, headers: Mapping[str, str] | None = None) -> JSONResponse:
    extra = error.extra or {}
    status = int(extra.get("scim_status", error.status))
    detail = error.detail or error.title
    if error.code != "scim_error":
        detail = f"{error.code}: {detail}"  # the gateway's code, for operators' searches
    scim_type = extra.get("scimType")
    return JSONResponse(
        scim_body(status, detail, scim_type if isinstance(scim_type, str) else None),
        status_code=status,
        media_type=SCIM_JSON,
        headers=dict(headers or {}),
    )


def scim_plain(status: int, detail: str, headers: Mapping[str, str] | None) -> JSONResponse:
    """An HTTP-level refusal (404 no such path, 405 method not allowed)."""
    return JSONResponse(
        scim_body(status, detail), status_code=status, media_type=SCIM_JSON, headers=headers
    )
