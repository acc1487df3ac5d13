"""Bodies nested too deeply to parse with Python's json module, found before it tries.

Python's parser recurses once per level and raises RecursionError past about a thousand;
CPython 3.11 does not always recover from one raised deep inside C code (a later parse of
source code in the process failed with "SystemError: AST constructor recursion depth
mismatch"). pydantic-core's parser (jiter) stops at 200 levels with a plain ValueError,
and parses 30 MB in about 25 ms: it looks first, and no legitimate body nests that deep.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic_core

TOO_DEEP = "JSON nested too deeply"


def nested_too_deeply(raw: bytes) -> bool:
    try:
        pydantic_core.from_json(raw)
    except ValueError as exc:
        return "recursion limit exceeded" in str(exc)
    return False


def loads(raw: bytes, **options: Any) -> Any:
    """`json.loads(raw, **options)`; ValueError(TOO_DEEP) for a body nested too deeply,
    before Python's parser recurses into it."""
    if nested_too_deeply(raw):
        raise ValueError(TOO_DEEP)
    return json.loads(raw, **options)
