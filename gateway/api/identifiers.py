"""Identifiers from a request's path: one that no write could have made names nothing.

Ingest refuses control characters in every identifier (gateway/ingest/parse.py), and a
string holding a lone surrogate cannot be stored at all (SQLite cannot encode it;
PostgreSQL refuses a NUL, a control character). So an identifier holding either is
answered 404, exactly like a missing one, before a database sees it and fails with an
error of its own (a 500). Anything else ingest accepts (a no-break space, a zero-width
joiner) is looked up as it is; where a route names a stored doc_id or version, one over
ingest's bound of MAX_ID_BYTES names nothing either (`no_stored_id`).
"""

from __future__ import annotations

from fastapi import Request

from gateway.domain import MAX_ID_BYTES, has_unstorable
from gateway.errors import GatewayError


def names_nothing(value: object) -> bool:
    """True for a value no stored identifier can equal."""
    return not isinstance(value, str) or has_unstorable(value)


NO_SUCH_VERSION = "no such version: identifiers are printable text of at most 1,024 bytes"


def no_stored_id(value: str) -> bool:
    """True for a doc_id or version no write could have stored: one `names_nothing`, or one
    over ingest's bound (MAX_ID_BYTES in UTF-8, which `gateway ingest` and the push both
    keep). It is answered 404 like a missing one; one within the bound is looked up, so
    every version that was stored can be named."""
    return names_nothing(value) or len(value.encode()) > MAX_ID_BYTES


def printable_path(request: Request) -> None:
    """404 for a path (or `?version=`) naming what no write could have named."""
    values = [*request.path_params.values(), *request.query_params.getlist("version")]
    if any(names_nothing(v) for v in values):
        raise GatewayError("not_found", "no such resource: identifiers hold no control character")
