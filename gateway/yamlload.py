"""YAML as the gateway reads it: policy files, document front matter and sidecars.

PyYAML's safe loader constructs no objects, but it still honours anchors and aliases: a few
hundred bytes of `&a [*b, *b, ...]` levels expand to gigabytes once anything walks the
result (validation, hashing, an error message). None of these files needs them, so they
are refused as they are met, before anything is built, with the line they are on. Nesting
is bounded too: PyYAML composes recursively, and a deep `[[[[...` would otherwise end in a
RecursionError (a 500) rather than a clear refusal.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.events import AliasEvent, CollectionStartEvent
from yaml.nodes import Node

MAX_DEPTH = 64  # policies nest 4 levels, documents' metadata 2; far below recursion limits

ALIASES_REFUSED = "anchors and aliases (& and *) are not accepted"


class NoAliasLoader(yaml.SafeLoader):
    """The safe loader, refusing anchors, aliases and nesting deeper than MAX_DEPTH.

    Errors are ComposerErrors (YAMLError), so callers that already report a YAMLError's
    `problem` and line report these the same way; the problem names the construct, never
    the value."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, AliasEvent) or getattr(event, "anchor", None) is not None:
            raise ComposerError(None, None, ALIASES_REFUSED, event.start_mark)
        nests = isinstance(event, CollectionStartEvent)
        if nests and self._depth >= MAX_DEPTH:
            raise ComposerError(
                None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark
            )
        self._depth += nests
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= nests


def load(text: str | bytes) -> Any:
    """One YAML document, read by NoAliasLoader."""
    return yaml.load(text, Loader=NoAliasLoader)  # a SafeLoader subclass


def yaml_problem(exc: yaml.YAMLError, first_line: int = 1) -> str:
    """`at line N: what` from a YAML error, without the snippet of the text PyYAML quotes."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + first_line}" if mark is not None else ""
    return f"{where}: {getattr(exc, 'problem', None) or 'cannot be parsed'}"
