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
import re
import sys
import textwrap
import threading
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

# Python's own words between the tracebacks of a chain.
# Libraries whose log lines quote the document they read: pypdf's warnings name a font's
# encoding, a stream or a name object as the PDF wrote it ("Advanced encoding /<text>").
QUOTING_LIBRARIES = ("pypdf",)
CAUSE = "The above exception was the direct cause of the following exception:"
CONTEXT = "During handling of the above exception, another exception occurred:"
_made_by: Callable[..., logging.LogRecord] | None = None  # the factory `install` wraps


def describe(exc: BaseException) -> str:
    """Like a traceback, with each exception's line naming its type alone; the chain
    (`raise ... from`, and exceptions raised while handling another) oldest first, and an
    exception group's members after it."""
    return _described(exc, set())


def _described(exc: BaseException, seen: set[int]) -> str:
    """`seen` is shared with the members of groups: a member re-raised from its group
    (`raise group.exceptions[0]`) has the group as its context, a cycle."""
    chain: list[tuple[BaseException, str]] = []
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
        parts.append(
            f"Traceback (most recent call last):\n{frames}{_name(raised)} (message withheld)"
        )
        if isinstance(raised, BaseExceptionGroup):  # what a task group raises: its members too
            members = [m for m in raised.exceptions if id(m) not in seen]
            for n, member in enumerate(members, 1):
                inner = textwrap.indent(_described(member, seen), "  | ")
                parts.append(f"  +-- member {n} of {len(raised.exceptions)}:\n{inner}")
        if led_to:
            parts.append(f"\n{led_to}\n")
    return "\n".join(parts)


def _name(exc: BaseException) -> str:
    kind = type(exc)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


def install() -> None:
    """From now on no exception's message reaches a log or standard error by the ways
    Python reports one, nor a document's words by a library that quotes them
    (QUOTING_LIBRARIES): a log record keeps `describe`'s text of its exception, not the
    exception; asyncio's report of a failed task or callback, whose text quotes the
    exception's repr, keeps its first words only; an exception no code caught, in any
    thread, is printed by `describe`. Once per process; calling again changes nothing."""
    global _made_by
    if _made_by is not None:
        return
    _made_by = logging.getLogRecordFactory()
    logging.setLogRecordFactory(_without_messages)
    sys.excepthook = _uncaught
    threading.excepthook = _uncaught_in_thread


def _without_messages(*args: Any, **kwargs: Any) -> logging.LogRecord:
    assert _made_by is not None
    record = _made_by(*args, **kwargs)
    exc_info = record.exc_info
    if exc_info and exc_info[1] is not None:
        # Formatters print exc_text as it is when exc_info is gone; no handler can reach
        # the exception's message any more.
        record.exc_text = _safely_described(exc_info[1])
        record.exc_info = None
        if record.name == "asyncio":
            # "Task exception was never retrieved\nfuture: <Task ... exception=
            # ValueError('...')>", "Exception in callback <Handle f('...')>": the text
            # itself quotes the exception or a callback's arguments; its words before the
            # first repr stay.
            said = re.split(r"[<(\n]", record.getMessage(), maxsplit=1)[0].strip()
            record.msg, record.args = (
                f"{said or 'asyncio reported an exception'} (details withheld)",
                None,
            )
    if record.name.split(".")[0] in QUOTING_LIBRARIES:
        # The library and the level stay, for an operator to see that one complained.
        library = record.name.split(".")[0]
        record.msg, record.args = f"{library} reported a problem (its words withheld)", None
    return record


def _safely_described(exc: BaseException) -> str:
    """`describe`, or the type's name alone should it fail: logging must never raise."""
    try:
        return describe(exc)
    except Exception:
        return f"{_name(exc)} (message withheld; its traceback could not be described)"


def _uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, exc, tb)  # no message to withhold, and the usual output
        return
    sys.stderr.write(_safely_described(exc) + "\n")


def _uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None or issubclass(args.exc_type, SystemExit):
        return  # as threading's own hook: SystemExit ends a thread quietly
    name = args.thread.name if args.thread is not None else "a thread"
    sys.stderr.write(f"Exception in thread {name}:\n{_safely_described(args.exc_value)}\n")
