"""Strangers cost nothing: body limits and authentication before any body is read.

Pure ASGI, in front of the routes. For a request that may carry a body:

1. A declared `Content-Length` over the route's limit is answered 413 `body_too_large`
   at once, before anything else (authentication included).
2. A body (a `Content-Length` over 0, or chunked) that its headers say is not JSON, in
   UTF-8, uncompressed, is answered 415 `unsupported_media_type`, also from the headers
   alone: a `Content-Type` other than `application/json` or a `+json` type (RFC 6839), a
   `charset` other than UTF-8 (RFC 8259 s8.1), a `Content-Encoding` other than `identity`
   (then with `Accept-Encoding: identity`, RFC 9110 s15.5.16). A body without a
   `Content-Type` is JSON, as scripts send it: the routes get every body accepted here
   labelled `application/json` (FastAPI would read an unlabelled one as bytes, and the MCP
   SDK takes no other type).
3. On a protected route, the caller is authenticated from the headers alone, with the same
   dependency the routes use (`authenticated_caller`, whose result the route then reuses):
   missing or invalid credentials are answered 401 before one byte of the body is read,
   let alone parsed (malformed JSON without a token is a 401, not a 422).
4. The body is read here, never past the limit, and handed to the route as it came: a
   chunked body that runs over is answered 413 with what was read dropped.

Every early answer closes the connection, so the rest of a large body is never read: the
server reads at most its flow-control window (64 KiB) beyond what it already buffered.
"""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.problems import problem_response
from gateway.api.schemas import AclChange
from gateway.api.security import authenticated_caller, bearer, scim_caller
from gateway.errors import GatewayError

DEFAULT_LIMIT = 64 * 1024
# (method, path) -> bytes; the contract's larger bodies (ingest, policy preview).
ROUTE_LIMITS = {
    ("POST", "/admin/documents"): 32 * 1024 * 1024,
    ("POST", "/admin/policy/preview"): 4 * 1024 * 1024,
    ("POST", "/v1/chat/completions"): 1024 * 1024,  # chat apps send the whole conversation
}


def _largest_acl_change() -> int:
    """Bytes of the largest body the ACL route's schema admits, so that every ACL a push
    accepts can be set again: each principal at its longest, every character escaped
    (`\\"`, `\\\\`), quoted, with a separator and a pretty-printer's indentation."""
    acl = AclChange.model_json_schema()["properties"]["acl"]
    per_principal = 2 * int(acl["items"]["maxLength"]) + 16
    return int(acl["maxItems"]) * per_principal + 4096  # the braces, the keys and a version


# PUT /admin/documents/{doc_id:path}/acl, as the router matches it (a doc_id may hold '/').
ACL_ROUTE = re.compile(r"/admin/documents/.*/acl")
ACL_LIMIT = _largest_acl_change()
# Paths that authenticate for themselves, still behind the body limit: /mcp answers 401
# with its own challenge (the resource metadata an MCP client needs to get a token).
SELF_AUTHENTICATING = frozenset({"/mcp"})
SCIM_PREFIX = "/scim/v2/"
# An identity provider's PATCH carries up to scim_schemas.MAX_MEMBERS members (a JSON
# object each, ~60 bytes); past that it is refused as a SCIM error, not cut off here.
SCIM_LIMIT = 1024 * 1024
WITH_BODY = frozenset({"POST", "PUT", "PATCH", "DELETE"})
JSON_TYPES = "application/json (or another JSON type, application/...+json) in UTF-8"
# RFC 9110's token, at most 127 characters (RFC 6838's bound on a type's name): what a
# refusal may name of the headers sent.
TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]{1,127}")
MEDIA_TYPE = re.compile(rf"{TOKEN.pattern}/{TOKEN.pattern}")


def body_limit(method: str, path: str) -> int:
    if path.startswith(SCIM_PREFIX):
        return SCIM_LIMIT
    if method == "PUT" and ACL_ROUTE.fullmatch(path):
        return ACL_LIMIT
    return ROUTE_LIMITS.get((method, path), DEFAULT_LIMIT)


class RequestGuard:
    def __init__(self, app: ASGIApp, public_paths: frozenset[str]) -> None:
        self.app = app
        self.public_paths = public_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in WITH_BODY:
            await self.app(scope, receive, send)
            return
        limit = body_limit(scope["method"], scope["path"])
        if _declared_length(scope) > limit:
            await _refuse(scope, receive, send, _too_large(limit))
            return
        if _declares_body(scope):
            unsupported = _unsupported_body(scope)
            if unsupported is not None:
                await _refuse(scope, receive, send, unsupported)
                return
            _label_as_json(scope)
        if scope["path"] not in self.public_paths | SELF_AUTHENTICATING:
            request = Request(scope)
            try:
                credentials = await bearer(request)
                who = scim_caller if scope["path"].startswith(SCIM_PREFIX) else authenticated_caller
                request.state.caller = await who(request, credentials)
            except GatewayError as exc:
                await _refuse(scope, receive, send, exc)
                return
        messages = await _read_body(receive, limit)
        if messages is None:
            await _refuse(scope, receive, send, _too_large(limit))
            return
        await self.app(scope, _replay(messages, receive), send)


def _declared_length(scope: Scope) -> int:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0  # the server's parser refuses a malformed length itself
    return 0


def _declares_body(scope: Scope) -> bool:
    return _declared_length(scope) > 0 or any(
        name == b"transfer-encoding" for name, _ in scope["headers"]
    )


def _unsupported_body(scope: Scope) -> GatewayError | None:
    """Why the headers say the body is not JSON the routes can read, or None."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            refusal = _unsupported_media_type(value.decode("latin-1"))
        elif name == b"content-encoding":
            refusal = _unsupported_coding(value.decode("latin-1"))
        else:
            continue
        if refusal is not None:
            return refusal
    return None


def _unsupported_media_type(value: str) -> GatewayError | None:
    media_type, *parameters = (part.strip() for part in value.lower().split(";"))
    kind, _, subtype = media_type.partition("/")
    if kind != "application" or not (subtype == "json" or subtype.endswith("+json")):
        sent = _shown(media_type, MEDIA_TYPE)
        return GatewayError(
            "unsupported_media_type",
            f"Content-Type {sent} is not accepted: send the body as {JSON_TYPES}",
        )
    for parameter in parameters:
        name, _, charset = (part.strip().strip('"') for part in parameter.partition("="))
        if name == "charset" and charset != "utf-8":
            sent = _shown(charset, TOKEN)
            return GatewayError(
                "unsupported_media_type",
                f"charset {sent} is not accepted: a JSON body is UTF-8 (RFC 8259)",
            )
    return None


def _unsupported_coding(value: str) -> GatewayError | None:
    codings = [coding.strip().lower() for coding in value.split(",")]
    refused = [coding for coding in codings if coding not in ("", "identity")]
    if not refused:
        return None
    return GatewayError(
        "unsupported_media_type",
        f"Content-Encoding {_shown(refused[0], TOKEN)} is not accepted: send the body "
        "uncompressed (identity)",
        headers={"Accept-Encoding": "identity"},
    )


def _shown(sent: str, form: re.Pattern[str]) -> str:
    """What was sent, for the detail, only when it is a well-formed name: a header may hold
    any text of the caller's, and a problem echoes none."""
    return sent if form.fullmatch(sent) else "(malformed)"


def _label_as_json(scope: Scope) -> None:
    """The routes' label for an accepted body (see the module's docstring). In place: the
    outer middleware (audit, metrics) read this scope after the route."""
    others = [(name, value) for name, value in scope["headers"] if name != b"content-type"]
    scope["headers"] = [*others, (b"content-type", b"application/json")]


async def _read_body(receive: Receive, limit: int) -> list[Message] | None:
    """The body's messages, or None as soon as it runs over `limit`."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages  # the client went away: the route sees the disconnect
        size += len(message.get("body", b""))
        if size > limit:
            return None
        if not message.get("more_body", False):
            return messages


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """The body as it was read, then the connection as it goes (a streamed answer
    still learns of a disconnect)."""
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed


def _too_large(limit: int) -> GatewayError:
    return GatewayError("body_too_large", f"the request body exceeds {limit} bytes")


async def _refuse(scope: Scope, receive: Receive, send: Send, error: GatewayError) -> None:
    response = problem_response(error, scope["path"])
    response.headers["connection"] = "close"  # the rest of the body is never read
    await response(scope, receive, send)
