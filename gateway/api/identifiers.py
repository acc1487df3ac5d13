"""Identifiers from a request's path: one that no write could have made names nothing.

Ingest refuses control characters in every identifier (gateway/ingest/parse.py), the
directory refuses them in every value, and a string holding a NUL or a lone surrogate
cannot be stored at all (PostgreSQL refuses the one, SQLite cannot encode the other). So
such an identifier is answered 404, exactly like a missing one, before a database sees it
and fails with an error of its own (a 500).
"""

from __future__ import annotations

from fastapi import Request

from gateway.errors import GatewayError

LONGEST = 4096  # characters: longer than any identifier a write accepts


def names_nothing(value: object, longest: int = LONGEST) -> bool:
    """True for a value no stored identifier can equal."""
    return not (isinstance(value, str) and len(value) <= longest and value.isprintable())


def printable_path(request: Request) -> None:
    """404 for a path (or `?version=`) naming what no write could have named."""
    values = [*request.path_params.values(), *request.query_params.getlist("version")]
    if any(names_nothing(v) for v in values):
        raise GatewayError("not_found", "no such resource: identifiers are printable text")
