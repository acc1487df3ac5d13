"""Turn input files into validated Documents, or refuse the whole batch listing every problem.

Deny by default (invariants 2 and 4): a document without a usable ACL, tenant, region or
effective date is refused here, before anything is chunked, embedded or written.
"""

from __future__ import annotations

import datetime as dt
import difflib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

from gateway.domain import (
    MAX_ID_BYTES,
    MAX_TENANT_BYTES,
    PRINCIPAL_FORM,
    Document,
    Visibility,
    canonical_name,
    has_unstorable,
    name_problem,
)
from gateway.jsonbody import loads
from gateway.uris import as_relative_path, is_link_safe, scheme_of
from gateway.yamlload import NoAliasLoader, shown_key

# The document fields that front matter, a sidecar or a JSONL record may give.
FIELDS = (
    "doc_id",
    "version",
    "title",
    "uri",
    "tenant",
    "region",
    "acl",
    "effective_from",
    "effective_to",
)
SUFFIXES = frozenset({".md", ".markdown", ".txt", ".jsonl"})
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")  # not \d: it matches any Unicode digit
_HEADING = re.compile(r"#[ \t]+(.*?)[ \t#]*")
_VERSION_FORBIDDEN = re.compile(r"[@:/\s]")  # '@' and ':' delimit chunk IDs; '/' breaks URLs
_ACL_FORM = "expected kind:name, e.g. user:ann, group:sales, support:eu"


@dataclass(frozen=True)
class DocumentProblem:
    source: str  # "path/to/file.md" or "path/to/docs.jsonl:17" (1-based line)
    field: str
    message: str  # never includes the document body


class DocumentsRefused(Exception):
    """The batch is refused as a whole; `problems` lists everything found, not just the first."""

    def __init__(self, problems: Sequence[DocumentProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(f"{p.source}: {p.field}: {p.message}" for p in self.problems))


def strict_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`'s object_pairs_hook that refuses a key given twice: the last would
    win silently (a second `acl` replacing the first)."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {_shown(key)}")
        seen.add(key)
    return dict(pairs)


def _shown(value: object) -> str:
    """A refused value in a message: a string's start, else only its type (a repr would
    expand a nested value in full before any cut, and could quote what it holds)."""
    return f"{value!r:.60}" if isinstance(value, str) else type(value).__name__


def refuse(source: str, field: str, message: str) -> DocumentsRefused:
    return DocumentsRefused([DocumentProblem(source, field, message)])


class _Checker:
    """Checks one record field by field, collecting every problem instead of stopping."""

    def __init__(self, record: Mapping[Any, Any], source: str) -> None:
        self.record, self.source = record, source
        self.problems: list[DocumentProblem] = []

    def fail(self, field: str, message: str) -> None:
        self.problems.append(DocumentProblem(self.source, field, message))

    def ident(self, field: str, value: object, max_bytes: int | None = None) -> str | None:
        """`value` when it is a usable identifier, of at most `max_bytes` in UTF-8 if given
        (what the catalog can index: `MAX_ID_BYTES`); else None, the problem noted."""
        if value is None:
            self.fail(field, "required")
        elif not isinstance(value, str):
            self.fail(field, f"must be a string, got {type(value).__name__}")
        elif (problem := name_problem(value)) is not None:
            # Identifiers are compared exactly with claims: the rule every name follows.
            self.fail(field, f"{problem}: {value!r:.60}")
        elif max_bytes is not None and (size := len(value.encode())) > max_bytes:
            self.fail(field, f"is {size} bytes in UTF-8; the limit is {max_bytes} bytes")
        else:
            return value
        return None

    def version(self) -> str | None:
        value = self.record.get("version", "1")
        # An int is unambiguous (YAML's plain versions arrive as written: _MetadataLoader);
        # a JSON float (1.10 reads as 1.1) is left to ident to refuse.
        integer = isinstance(value, int) and not isinstance(value, bool)
        version = self.ident("version", str(value) if integer else value, MAX_ID_BYTES)
        if version is not None and _VERSION_FORBIDDEN.search(version):
            self.fail("version", f"must not contain '@', ':', '/' or whitespace: {version!r:.60}")
            return None
        return version

    def acl(self) -> tuple[str, ...] | None:
        value = self.record.get("acl")
        if not isinstance(value, list) or not value:
            # A lone string is refused, not wrapped: "group:a, group:b" is likely a typo.
            got = "nothing" if value is None else _shown(value)
            self.fail("acl", f"must be a non-empty list of principals ({_ACL_FORM}), got {got}")
            return None
        before = len(self.problems)
        entries = [self.ident("acl", entry) for entry in value]
        for entry in (e for e in entries if e is not None and not PRINCIPAL_FORM.fullmatch(e)):
            self.fail("acl", f"{entry!r:.60} has no kind prefix; {_ACL_FORM}")
        # As tokens' claims are compared: NFC (gateway/domain.py, `canonical_name`).
        principals = tuple(canonical_name(e) for e in entries if e)
        return principals if len(self.problems) == before else None

    def date(self, field: str, *, required: bool) -> dt.date | None:
        value = self.record.get(field)
        if value is None:
            if required:  # an unknown start is refused, never read as "always valid"
                self.fail(field, "required (YYYY-MM-DD)")
            return None
        # datetime subclasses date, but a time of day has no place in a day-granular range.
        if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
            return value
        if isinstance(value, str) and _DATE.fullmatch(value):
            try:
                return dt.date.fromisoformat(value)
            except ValueError:
                pass  # well-formed but impossible, e.g. 2024-02-30
        self.fail(field, f"must be a date YYYY-MM-DD, got {_shown(value)}")
        return None

    def optional_str(self, field: str) -> str | None:
        value = self.record.get(field)
        if value is None or isinstance(value, str):
            return value
        self.fail(field, f"must be a string, got {type(value).__name__}")
        return None

    def uri(self) -> str | None:
        """An `http(s)` URL or a relative reference: clients show it as a link."""
        value = self.optional_str("uri")
        if value is None:
            return None
        if has_unstorable(value):
            self.fail("uri", "contains control characters or lone surrogates")
        elif not is_link_safe(value):
            scheme = f"{scheme_of(value)}:"
            self.fail("uri", f"must be an http(s) URL or a relative reference, not {scheme:.24}")
        else:
            return value
        return None


def first_heading(text: str) -> str | None:
    """The first `# ` heading outside fenced code, where `# comment` is not a heading."""
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (match := _HEADING.fullmatch(line)) and match.group(1):
            return match.group(1)
    return None


def checked_acl(acl: Sequence[str]) -> tuple[tuple[str, ...], list[str]]:
    """An `acl` as ingest reads it: its principals, and what ingest refuses of them (for an
    ACL change, which must store nothing a push would refuse)."""
    checker = _Checker({"acl": list(acl)}, "acl")
    return checker.acl() or (), [p.message for p in checker.problems]


def parse_record(
    record: Mapping[str, Any], body: object, source: str, default_uri: str
) -> Document:
    """One Document from metadata and body (None: no body; anything but a string is refused),
    or DocumentsRefused with all of its problems. Only known fields are read: extra ones
    (even `text`) cannot override anything."""
    c = _Checker(record, source)
    text = body if isinstance(body, str) else None
    doc_id = c.ident("doc_id", record.get("doc_id"), MAX_ID_BYTES)
    version = c.version()
    tenant = c.ident("tenant", record.get("tenant"), MAX_TENANT_BYTES)
    region = c.ident("region", record.get("region"))
    acl = c.acl()
    start = c.date("effective_from", required=True)
    end = c.date("effective_to", required=False)
    if start is not None and end is not None and end < start:
        c.fail("effective_to", f"{end} is before effective_from {start}")
    if body is not None and text is None:  # JSONL's `"text": 5`: no body is missing
        c.fail("text", f"must be a string, got {type(body).__name__}")
    elif text is None or not text.strip():
        c.fail("text", "the document body is missing or empty")
    title, uri = c.optional_str("title"), c.uri()
    for field, value in (("text", text), ("title", title)):
        if value is not None and "\x00" in value:
            # PostgreSQL stores no NUL in text: refused here, on every catalog, rather
            # than accepted and then failing the job on one of them.
            c.fail(field, "contains NUL characters (\\x00), which no text may hold")
        elif value is not None and _LONE_SURROGATE.search(value):
            # Half of a UTF-16 pair (a JSON `\\ud800` alone): no UTF-8 encodes it, so the
            # model, the catalog and HTTP would each fail on it later, naming nothing.
            c.fail(field, "contains a lone surrogate (half a UTF-16 pair), which no text may hold")
    # The second test only narrows types for mypy: without problems, every value is set.
    if c.problems or not (doc_id and version and tenant and region and acl and start and text):
        raise DocumentsRefused(c.problems)
    title = title.strip() if title and title.strip() else first_heading(text) or doc_id
    uri = as_relative_path(default_uri) if uri is None else uri
    visibility = Visibility(tenant, region, acl, start, end)
    return Document(doc_id, version, title, uri, text, visibility, source=source)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _paired(value: Any) -> Any:
    """`value` with each string's UTF-16 surrogate pairs joined: YAML reads a JSON-style
    `"\\ud83d\\ude00"` as two halves, which are one character (an emoji); a lone half
    stays, for the checks to refuse."""
    if isinstance(value, str):
        if not _LONE_SURROGATE.search(value):
            return value
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "surrogatepass")
    if isinstance(value, dict):
        return {_paired(k): _paired(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_paired(v) for v in value]
    return value


_YAML = "tag:yaml.org,2002:"


class _MetadataLoader(NoAliasLoader):
    """NoAliasLoader reading a plain `version` as the text written: YAML 1.1 reads `010` as
    8, `1_0` as 10, `0x1F` as 31 and `1:30` as 90, a version other than the file's."""

    def construct_document(self, node: Node) -> Any:
        if isinstance(node, MappingNode):
            for key, value in node.value:
                numeric = value.tag in (_YAML + "int", _YAML + "float")
                if key.value == "version" and isinstance(value, ScalarNode) and numeric:
                    value.tag = _YAML + "str"
        return super().construct_document(node)


def _key(key: object) -> str:
    # A key in backticks as written; a long or unprintable one as shown_key cuts it.
    if isinstance(key, str) and key.isprintable() and len(key) <= 60:
        return f"`{key}`"
    return shown_key(key)


def _unknown_keys(
    source: str, field: str, meta: Mapping[Any, Any], known: Sequence[str], *, strict: bool
) -> None:
    """Refuse keys that are not fields: all of them when `strict` (a sidecar is the gateway's
    own file), else only those that look like a field misspelt (`effective_until`, `ACL`):
    ignored, they would leave the field to a broader default. Front matter's other keys
    (`owner`, `tags`, a site generator's own) stay ignored."""
    problems = []
    for key in meta:
        if isinstance(key, str) and key in known:
            continue
        lowered = key.lower() if isinstance(key, str) else ""
        near = difflib.get_close_matches(lowered, known, n=1, cutoff=0.8)
        hint = f" (did you mean `{near[0]}`?)" if near else ""
        if strict:
            hint += f"; expected only {', '.join(known)}"
        if near or strict:
            problems.append(DocumentProblem(source, field, f"unknown key {_key(key)}{hint}"))
    if problems:
        raise DocumentsRefused(problems)


def _given(meta: dict[Any, Any]) -> dict[Any, Any]:
    """`meta` without a blank (null) `effective_to`: in a file it most likely is a template's
    empty slot, and read as "open-ended" it would undo an end date given earlier (a sidecar,
    `--effective-to`). Absent everywhere, the document is open-ended all the same."""
    if "effective_to" in meta and meta["effective_to"] is None:
        return {k: v for k, v in meta.items() if k != "effective_to"}
    return meta


def front_matter(source: str, content: str) -> tuple[dict[str, Any] | None, str]:
    """(metadata, body) of a text file; (None, content) when it has no front matter.

    Front matter opens with a first line `---` and closes with `---` or `...` (YAML's
    end of document, as Pandoc writes it); one never closed is refused, not read as body
    text, which would drop its fields and leave the file to broader defaults. A first line
    ` ---` (indented) opens nothing: Markdown reads it as a rule, and YAML has no such
    marker."""
    lines = content.split("\n")  # not splitlines(), which also splits on \f, \x85, \u2028...
    if lines[0].rstrip() != "---":
        return None, content
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip() in ("---", "...")), None)
    if end is None:
        raise refuse(
            source,
            "front_matter",
            "front matter opened by --- on line 1 is never closed (expected a line --- or ...)",
        )
    try:
        meta = _paired(yaml.load("\n".join(lines[1:end]), Loader=_MetadataLoader))
    except yaml.YAMLError as exc:
        # Problem and position only: PyYAML's full message quotes the offending lines.
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 2}" if mark is not None else ""
        what = getattr(exc, "problem", None) or "cannot be parsed"
        raise refuse(source, "front_matter", f"invalid YAML{where}: {what}") from None
    if not isinstance(meta, dict):
        raise refuse(source, "front_matter", "must be a mapping")
    _unknown_keys(source, "front_matter", meta, FIELDS, strict=False)
    return _given(meta), "\n".join(lines[end + 1 :])


def read_metadata_file(path: Path, content: str | None = None) -> dict[str, Any]:
    """A sidecar's metadata (YAML or JSON: YAML reads both), refusing duplicate and unknown
    keys; `content` is its text when the caller has read it already (sources.py reads a
    folder's files itself, so that none outside it is ever opened)."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8-sig") if content is None else content
        if path.suffix.lower() == ".json":  # JSON as JSON: a tab-indented one is no valid YAML
            meta = loads(text.encode(), object_pairs_hook=strict_object)
        else:
            meta = _paired(yaml.load(text, Loader=_MetadataLoader))
    except (OSError, UnicodeError) as exc:
        raise refuse(source, "file", getattr(exc, "strerror", None) or str(exc)) from None
    except ValueError as exc:  # JSON's: its message quotes no content
        message = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise refuse(source, "metadata", f"invalid JSON: {message}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        what = getattr(exc, "problem", None) or "cannot be parsed"
        raise refuse(source, "metadata", f"invalid YAML{where}: {what}") from None
    if not isinstance(meta, dict):
        raise refuse(source, "metadata", "must be a mapping of document fields")
    _unknown_keys(source, "metadata", meta, FIELDS, strict=True)
    return _given(meta)


def parse_jsonl_line(source: str, line: str, defaults: Mapping[str, Any]) -> Document:
    try:
        # Depth first: Python's parser recurses once per level (`gateway.jsonbody`).
        record = loads(line.encode("utf-8", "surrogatepass"), object_pairs_hook=strict_object)
    except ValueError as exc:  # JSONDecodeError's msg carries no content; ours neither
        message = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise refuse(source, "json", message) from None
    if not isinstance(record, dict):
        raise refuse(source, "json", "must be a JSON object")
    _unknown_keys(source, "json", record, (*FIELDS, "text"), strict=False)
    record = _given(record)
    return parse_record({**defaults, **record}, record.get("text"), source, "")
