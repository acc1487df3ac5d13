"""JSON bodies read as the push route reads its own: a key given twice is refused.

Python's parser keeps the last of two keys silently, so `{"acl": ["group:nobody"], "acl":
["group:staff"]}` applied staff while a proxy, a WAF or a reviewer reading the first saw
another ACL; `/search` with two `top_k` or two `query` is the same ambiguity. Set as the
routers' `route_class`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from gateway.ingest.parse import strict_object
from gateway.jsonbody import loads


class _StrictJsonRequest(Request):
    """`json()` as the push route reads its body: a key given twice, or nesting too deep
    for Python's parser, is a ValueError (`gateway.jsonbody`, `strict_object`)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads(await self.body(), object_pairs_hook=strict_object)
        return self._json


class StrictJsonRoute(APIRoute):
    """A route whose JSON body is refused (422 validation_error, naming the key) when it
    gives a key twice, as POST /admin/documents refuses one: Python's parser keeps the
    last silently, so `{"acl": ["group:nobody"], "acl": ["group:staff"]}` applied staff
    while a proxy, a WAF or a reviewer reading the first saw another ACL. A body that
    parses is parsed once, here: FastAPI validates what this parse made."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:  # FastAPI reads no body for it (the push route's own)
            return handler

        async def strict_handler(request: Request) -> Response:
            strict = _StrictJsonRequest(request.scope, request.receive)
            try:
                if await strict.body():  # FastAPI reads no empty body either
                    await strict.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                pass  # not JSON at all: FastAPI answers it as on every route
            except ValueError as exc:  # a duplicate key, or nested too deeply; never the value
                error = {"loc": ("body",), "msg": str(exc), "type": "json_invalid"}
                raise RequestValidationError([error]) from None
            return await handler(strict)

        return strict_handler
