"""Exceptions in logs: their type and where they were raised, never their message.

Logs carry IDs only (docs/security.md, "ID-only traces"), and an exception's message can
quote what a caller sent or what a document holds: a query parser quotes the query, a
database driver the parameters of its statement, a decoder the bytes it could not read.
`describe` writes an exception, and every exception chained to it, as its frames and its
type's name. Once `install` has run, every log record made in the process, ours or a
library's (uvicorn's "Exception in ASGI application" included), carries that text
instead of its exception.
"""

from __future__ import annotations

import logging
import textwrap
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]

# Python's own words between the tracebacks of a chain.
CAUSE = "The above exception was the direct cause of the following exception:"
CONTEXT = "During handling of the above exception, another exception occurred:"
_made_by: Callable[..., logging.LogRecord] | None = None  # the factory `install` wraps


def describe(exc: BaseException) -> str:
    """Like a traceback, with each exception's line naming its type alone; the chain
    (`raise ... from`, and exceptions raised while handling another) oldest first."""
    chain: list[tuple[BaseException, str]] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    link = ""
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        chain.append((current, link))
        if current.__cause__ is not None:
            current, link = current.__cause__, CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            current, link = current.__context__, CONTEXT
        else:
            current = None
    parts: list[str] = []
    for raised, led_to in reversed(chain):
        frames = "".join(traceback.format_tb(raised.__traceback__))
        kind = type(raised)
        name = kind.__qualname__
        if kind.__module__ != "builtins":
            name = f"{kind.__module__}.{name}"
        parts.append(f"Traceback (most recent call last):\n{frames}{name} (message withheld)")
        if isinstance(raised, BaseExceptionGroup):  # what a task group raises: its members too
            for n, member in enumerate(raised.exceptions, 1):
                inner = textwrap.indent(describe(member), "  | ")
                parts.append(f"  +-- member {n} of {len(raised.exceptions)}:\n{inner}")
        if led_to:
            parts.append(f"\n{led_to}\n")
    return "\n".join(parts)


def install() -> None:
    """From now on, records keep `describe`'s text of their exception, not the exception
    (whose message a handler would print). Once per process; calling again changes nothing."""
    global _made_by
    if _made_by is not None:
        return
    _made_by = logging.getLogRecordFactory()
    logging.setLogRecordFactory(_without_messages)


def _without_messages(*args: Any, **kwargs: Any) -> logging.LogRecord:
    assert _made_by is not None
    record = _made_by(*args, **kwargs)
    exc_info = record.exc_info
    if exc_info and exc_info[1] is not None:
        # Formatters print exc_text as it is when exc_info is gone; no handler can reach
        # the exception's message any more.
        record.exc_text = describe(exc_info[1])
        record.exc_info = None
    return record
