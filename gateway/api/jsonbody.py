"""Bodies nested too deeply to parse with Python's json module, found before it tries.

Python's parser recurses once per level and raises RecursionError past about a thousand;
CPython 3.11 does not always recover from one raised deep inside C code (a later parse of
source code in the process failed with "SystemError: AST constructor recursion depth
mismatch"). pydantic-core's parser (jiter) stops at 200 levels with a plain ValueError,
and parses 30 MB in about 25 ms: it looks first, and no legitimate body nests that deep.
"""

from __future__ import annotations

import pydantic_core


def nested_too_deeply(raw: bytes) -> bool:
    try:
        pydantic_core.from_json(raw)
    except ValueError as exc:
        return "recursion limit exceeded" in str(exc)
    return False
