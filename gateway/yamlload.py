"""YAML as the gateway reads it: policy files, document front matter and sidecars.

PyYAML's safe loader constructs no objects, but it still honours anchors and aliases: a few
hundred bytes of `&a [*b, *b, ...]` levels expand to gigabytes once anything walks the
result (validation, hashing, an error message). None of these files needs them, so they
are refused as they are met, before anything is built, with the line they are on. Nesting
is bounded too: PyYAML composes recursively, and a deep `[[[[...` would otherwise end in a
RecursionError (a 500) rather than a clear refusal.

A key given twice in one mapping is refused too: PyYAML keeps the last, so a second
`admins:` further down a file would silently replace the first.

Policy files are read by PolicyLoader, which also keeps to the YAML core types (text,
numbers, booleans, null, lists and mappings): a `!!binary`, `!!set` or `!!timestamp` value,
a base-60 number (`1:30` is 90 to YAML 1.1) or a merge key would be read as something other
than what the file appears to say.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.events import AliasEvent, CollectionStartEvent
from yaml.nodes import MappingNode, Node, ScalarNode

MAX_DEPTH = 64  # policies nest 4 levels, documents' metadata 2; far below recursion limits

ALIASES_REFUSED = "anchors and aliases (& and *) are not accepted"

_TAG = "tag:yaml.org,2002:"
MERGE_TAG = _TAG + "merge"
# YAML 1.2's core schema: what a policy's values can be.
CORE_TAGS = frozenset(_TAG + kind for kind in ("str", "int", "float", "bool", "null", "seq", "map"))
# Plain scalars YAML 1.1 reads as other types that a policy reads as the text they are, as
# YAML 1.2 does: a date (`2024-01-01` is a datetime.date to PyYAML) and a lone `=`.
_PLAIN_TEXT_TAGS = frozenset({_TAG + "timestamp", _TAG + "value"})


class NoAliasLoader(yaml.SafeLoader):
    """The safe loader, refusing anchors, aliases, nesting deeper than MAX_DEPTH, keys given
    twice in one mapping and merge keys (`<<`: of no use without aliases).

    Errors are ComposerErrors or ConstructorErrors (YAMLError), so callers that already report
    a YAMLError's `problem` and line report these the same way; the problem names the
    construct, or a refused key by its start, never a value."""

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

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        unhashable: list[Any] = []  # YAML keys need not be hashable: those are scanned
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:
                raise ConstructorError(
                    None, None, "merge keys (<<) are not accepted", key_node.start_mark
                )
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:
                duplicate = key in unhashable
                unhashable.append(key)
            if duplicate:
                raise ConstructorError(
                    None, None, f"duplicate key {shown_key(key)}", key_node.start_mark
                )
        return super().construct_mapping(node, deep)


# A number in exponent form as YAML 1.2 writes it (`2e4`, `1.0e3`, `1e-3`).
_EXPONENT = re.compile(r"^[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")


class PolicyLoader(NoAliasLoader):
    """NoAliasLoader keeping to the YAML core types. A value of another type (an explicit
    `!!binary`, `!!set`, `!!timestamp`, `!!python/...` or local tag) is refused naming the
    tag, a base-60 number naming the form; a plain date is the text it reads as.

    YAML 1.1's booleans (yes/no/on/off), octal (012) and underscores (1_000) are kept: valid
    policies use them, and they mean what they meant."""

    def resolve(self, kind: type[Node], value: Any, implicit: Any) -> str:
        tag: str = super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]
        if kind is ScalarNode and implicit[0] and tag in _PLAIN_TEXT_TAGS:
            return _TAG + "str"
        if kind is ScalarNode and implicit[0] and tag == _TAG + "str" and _EXPONENT.match(value):
            # YAML 1.1 reads `2e4` and `1.0e3` (no dot, or no exponent sign) as text; they
            # loaded as numbers before numbers had to be written as numbers, and still do.
            return _TAG + "float"
        return tag

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        if node.tag not in CORE_TAGS:
            shown = node.tag.replace(_TAG, "!!", 1) if node.tag.startswith(_TAG) else node.tag
            raise ConstructorError(
                None,
                None,
                f"{shown[:60]} values are not accepted: only text, numbers, true/false, null, "
                "lists and mappings",
                node.start_mark,
            )
        return super().construct_object(node, deep)

    def construct_yaml_int(self, node: ScalarNode) -> int:
        _no_base_60(node)
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node: ScalarNode) -> float:
        _no_base_60(node)
        return super().construct_yaml_float(node)


def _no_base_60(node: ScalarNode) -> None:
    # YAML 1.1 reads `1:30` as 90 and `1:30.5` as 90.5: a budget written as a time would
    # silently become a number of milliseconds nobody meant.
    if ":" in node.value:
        raise ConstructorError(
            None,
            None,
            "base-60 numbers (like 1:30, which YAML 1.1 reads as 90) are not accepted: "
            "write the number, or quote text",
            node.start_mark,
        )


# The constructors are looked up by tag in a class-level table: point the int and float
# tags at PolicyLoader's own (SafeLoader's table is left as it is).
PolicyLoader.add_constructor(_TAG + "int", PolicyLoader.construct_yaml_int)
PolicyLoader.add_constructor(_TAG + "float", PolicyLoader.construct_yaml_float)


def shown_key(key: object) -> str:
    """A key in a message: a string's start, a number, true/false or null as YAML read it
    (`on` and `true` are both True), else only its type (never a nested value)."""
    if isinstance(key, str | int | float) or key is None:  # bool is an int
        return f"{key!r:.60}"
    return type(key).__name__


def load(text: str | bytes) -> Any:
    """One YAML document, read by NoAliasLoader."""
    return yaml.load(text, Loader=NoAliasLoader)  # a SafeLoader subclass


def load_policy_yaml(text: str | bytes) -> Any:
    """One policy file's YAML document, read by PolicyLoader."""
    return yaml.load(text, Loader=PolicyLoader)  # a SafeLoader subclass


def yaml_problem(exc: yaml.YAMLError, first_line: int = 1) -> str:
    """`at line N: what` from a YAML error, without the snippet of the text PyYAML quotes."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + first_line}" if mark is not None else ""
    return f"{where}: {getattr(exc, 'problem', None) or 'cannot be parsed'}"
