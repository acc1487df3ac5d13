"""Every error leaves the API as application/problem+json; nothing leaks a stack trace."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from gateway.api.openai_schemas import is_openai_path, openai_error, openai_problem
from gateway.api.scim_errors import is_scim_path, scim_plain, scim_problem
from gateway.errors import GatewayError, ProblemCode

PROBLEM_JSON = "application/problem+json"
log = logging.getLogger("gateway.api")

_HTTP_CODES: dict[int, ProblemCode] = {
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    422: "validation_error",
}
# What a 422 says is invalid, by where its errors are (the first part of each `loc`).
INVALID_PARTS = {
    "body": "the request body is invalid",
    "query": "the query parameters are invalid",
    "path": "the path is invalid",
}


def problem_response(error: GatewayError, path: str = "") -> JSONResponse:
    """The error as problem+json; under /v1/, in OpenAI's shape (same status and headers)."""
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else {}
    headers.update(error.headers or {})
    if is_scim_path(path):
        return scim_problem(error, headers)
    if is_openai_path(path):
        return openai_problem(error.problem(), headers)
    return JSONResponse(
        error.problem(), status_code=error.status, media_type=PROBLEM_JSON, headers=headers
    )


def _plain_problem(
    status: int,
    title: str,
    detail: str = "",
    headers: Mapping[str, str] | None = None,
    path: str = "",
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": title,
        "status": status,
        "code": _HTTP_CODES.get(status, "http_error"),
    }
    if detail:
        body["detail"] = detail
    if is_scim_path(path):
        return scim_plain(status, detail or title, headers)
    if is_openai_path(path):
        return openai_problem(body, dict(headers or {}))
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def describe_problems_as_sent(app: FastAPI) -> None:
    """Error responses appear in the OpenAPI document as application/problem+json, the media
    type they are sent with (FastAPI would list them as application/json); those of /v1/
    are OpenAI's JSON, and stay as they are."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        cached = app.openapi_schema is not None
        schema = generate()
        if not cached:
            for path, operations in schema.get("paths", {}).items():
                if is_openai_path(path):
                    for operation in operations.values():  # FastAPI's 422: /v1 sends 400
                        operation.get("responses", {}).pop("422", None)
                    continue
                for operation in operations.values():
                    for status, response in operation.get("responses", {}).items():
                        content = response.get("content", {})
                        if status[:1] in ("4", "5") and "application/json" in content:
                            response["content"] = {PROBLEM_JSON: content["application/json"]}
            components = schema.get("components", {}).get("schemas", {})
            if "HTTPValidationError" not in json.dumps(schema.get("paths", {})):
                components.pop("HTTPValidationError", None)
                components.pop("ValidationError", None)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def invalid_part(errors: list[dict[str, Any]]) -> str:
    """The 422's detail: the part of the request its errors are in, or the whole request
    when they are in several (a bad `?limit=` is no fault of the body)."""
    parts = {str(e["loc"][0]) for e in errors if e["loc"]}
    if len(parts) == 1:
        return INVALID_PARTS.get(parts.pop(), "the request is invalid")
    return "the request is invalid"


def allowed_methods(scope: Scope, routes: Sequence[BaseRoute], allow: str) -> str:
    """A 405's `Allow`: the methods of every route of the resource that matched first
    (Starlette names only the first route's), with HEAD wherever GET is
    (gateway.api.app.HeadAsGet). The resource is the first matching route's template: a
    doc_id may hold a slash, so `/admin/documents/x/acl` also matches the document
    route's `{doc_id:path}`, which is another resource (the document `x/acl`)."""
    methods = {m.strip() for m in allow.split(",") if m.strip()}
    matching = [r for r in routes if r.matches(scope)[0] is not Match.NONE]
    resource = getattr(matching[0], "path", None) if matching else None
    for route in matching:
        if getattr(route, "path", None) == resource:
            methods |= getattr(route, "methods", None) or set()
    if "GET" in methods:
        methods.add("HEAD")
    return ", ".join(sorted(methods))


def install_problem_handlers(app: FastAPI, routes: Sequence[BaseRoute]) -> None:
    """`routes`: every route the app serves, for the `Allow` of a 405."""

    @app.exception_handler(GatewayError)
    async def _gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return problem_response(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Locations and messages only: the offending input may be a secret or a document.
        errors = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type")}
            for e in exc.errors()
        ]
        if is_openai_path(request.url.path):  # OpenAI answers 400, naming the parameter
            first = errors[0] if errors else {"loc": [], "msg": ""}
            if first.get("type") == "json_invalid":  # its location is an offset, no parameter
                # Ours (gateway.api.strict_json) say why: "duplicate key 'model'".
                why = "" if first["msg"] == "JSON decode error" else f": {first['msg']}"
                message = f"the request body is not valid JSON{why}"
                return openai_error(400, "validation_error", message)
            where = [str(part) for part in first["loc"] if part != "body"]
            message = f"invalid {'.'.join(where) or 'request'}: {first['msg']}"
            return openai_error(400, "validation_error", message, where[0] if where else None)
        error = GatewayError("validation_error", invalid_part(errors), extra={"errors": errors})
        return problem_response(error, request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        path = request.url.path
        if exc.status_code == 400 and is_openai_path(path):
            return openai_error(400, "validation_error", "the request body is not UTF-8 JSON")
        if exc.status_code == 400 and is_scim_path(path):
            return scim_plain(400, "the request body is not UTF-8 JSON", None)
        if exc.status_code == 400:  # FastAPI's "error parsing the body" (e.g. not UTF-8)
            body_error = {"loc": ["body"], "msg": "not UTF-8 JSON", "type": "body_unreadable"}
            error = GatewayError(
                "validation_error", "the request body is invalid", extra={"errors": [body_error]}
            )
            return problem_response(error, path)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = allowed_methods(request.scope, routes, headers.get("Allow", ""))
        detail = str(exc.detail) if exc.detail else "HTTP error"
        return _plain_problem(exc.status_code, detail, "", headers, path)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled %s", type(exc).__name__, exc_info=exc)
        return problem_response(GatewayError("internal_error"), request.url.path)
