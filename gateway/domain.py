"""Core value types shared by ingest, retrieval and the API."""

from __future__ import annotations

import datetime as dt
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field

OPEN_END = dt.date.max  # effective_to of a version that has not been closed
# Joins a tenant to the rest of an identity in keys; never in a tenant, since control
# characters are refused at ingest.
TENANT_SEPARATOR = "\x1f"

# Bounds in UTF-8 bytes on the identifiers the catalog indexes, checked where they enter
# (ingest, key creation, a token's claims). PostgreSQL refuses a B-tree entry over 2,704
# bytes; uncompressed, an entry is 8 bytes and each value a 4-byte header, up to 3 bytes of
# alignment and its bytes. The widest entries hold a tenant with a doc_id and a version:
# the chunks' key (tenant, `<doc_id>@<version>:<ordinal>`, a 10-digit ordinal at most)
# 8 + (4 + 256) + (3 + 4 + 1,024 + 1 + 1,024 + 1 + 10) = 2,335, and the documents' (tenant,
# doc_id, version) 2,324; the directory's hold a tenant with a SCIM name of up to 2,000
# bytes, 8 + (4 + 256) + (3 + 4 + 2,000) = 2,275. (The push API's 512 characters alone
# would let a doc_id be 2,048 bytes.)
MAX_ID_BYTES = 1024  # a doc_id, and a version
MAX_TENANT_BYTES = 256
# A token's subject (`sub`), indexed alone (the audit trail's ix_audit_subject): 8 + 4 + 1,024.
MAX_SUBJECT_BYTES = 1024


def has_unstorable(text: str) -> bool:
    """Whether `text` holds a control character (NUL among them) or a lone surrogate: what
    ingest refuses in every identifier and uri, so no stored one holds either."""
    return any(unicodedata.category(c) in ("Cc", "Cs") for c in text)


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a principal or a user, or None: the one rule of every door
    that takes such names (token claims, ACL entries, API key principals, SCIM userName,
    externalId and displayName, policy names). Format characters (the ZWNJ and ZWJ that
    Persian, Hindi and emoji need) and no-break spaces inside a name are text; what is
    refused is what could never match the same name written by another door."""
    if not name.strip():
        return "must not be empty"
    if has_unstorable(name):
        return "contains a control character or a lone surrogate"
    if name != name.strip():
        # Names are compared exactly: "staff " would never match a caller's "staff".
        return "must not start or end with whitespace"
    return None


def canonical_name(name: str) -> str:
    """`name` as every door compares and stores it: Unicode NFC, so that "José" written
    with a combining accent (NFD, as some systems send it) is the same name as "José"."""
    return unicodedata.normalize("NFC", name)


_NUMBERS = re.compile(r"([0-9]+)")


def version_order(version: str) -> tuple[tuple[int, int | str], ...]:
    """How two versions of a document compare: as numbers where they are numbers ("10"
    after "9", "v1.10" after "v1.9"), else as text; equal ones by their whole text."""
    runs = (part for part in _NUMBERS.split(version) if part)
    parts = tuple((0, int(p)) if p.isdigit() and p.isascii() else (1, p) for p in runs)
    return (*parts, (2, version))


def version_label(doc_id: str, version: str) -> str:
    """`<doc_id>@<version>`: how a version is named within its tenant (to its people, in
    `closed_by`, and as the head of its chunk IDs)."""
    return f"{doc_id}@{version}"


def version_key(tenant: str, doc_id: str, version: str) -> str:
    """The identity of one document version, `(tenant, doc_id, version)`, as one string:
    the key of catalog plans and of both engines' per-version deletes. Two tenants' versions
    of the same `doc_id` never share a key. The `key` of every type that has one."""
    return f"{tenant}{TENANT_SEPARATOR}{version_label(doc_id, version)}"


def split_version_key(key: str) -> tuple[str, str, str]:
    """(tenant, doc_id, version) of a `version_key`."""
    tenant, _, rest = key.partition(TENANT_SEPARATOR)
    doc_id, _, version = rest.rpartition("@")
    return tenant, doc_id, version


@dataclass(frozen=True)
class Visibility:
    """The fields that decide who may see a chunk, denormalised onto every chunk."""

    tenant: str
    region: str
    acl: tuple[str, ...]
    effective_from: dt.date
    effective_to: dt.date | None  # None: open-ended


@dataclass(frozen=True)
class Document:
    doc_id: str
    version: str
    title: str
    uri: str
    text: str
    visibility: Visibility
    source: str = ""  # file (and line) it came from, for error messages and audit

    @property
    def key(self) -> str:
        """The identity of this version, tenant included (`version_key`)."""
        return version_key(self.visibility.tenant, self.doc_id, self.version)

    @property
    def label(self) -> str:
        """How this version is named to the people of its tenant (`version_label`)."""
        return version_label(self.doc_id, self.version)


@dataclass(frozen=True)
class Chunk:
    chunk_id: str  # <doc_id>@<version>:<ordinal>
    doc_id: str
    version: str
    ordinal: int
    title: str
    uri: str
    text: str
    token_count: int
    visibility: Visibility
    parent: int = 0  # ordinal of the section (Markdown heading) the chunk lies in

    @property
    def scoped_id(self) -> str:
        """The chunk's identity across tenants (chunk IDs are unique within one)."""
        return f"{self.visibility.tenant}{TENANT_SEPARATOR}{self.chunk_id}"

    @property
    def version_key(self) -> str:
        """The `key` of the document version this chunk is part of (`version_key`)."""
        return version_key(self.visibility.tenant, self.doc_id, self.version)


def chunk_id_for(doc_id: str, version: str, ordinal: int) -> str:
    return f"{version_label(doc_id, version)}:{ordinal}"


def split_chunk_id(chunk_id: str) -> tuple[str, str, int]:
    """Inverse of chunk_id_for; versions never contain '@' or ':' (refused at ingest)."""
    key, sep, ordinal = chunk_id.rpartition(":")
    doc_id, sep2, version = key.rpartition("@")
    if not sep or not sep2 or not doc_id or not ordinal.isdigit():
        raise ValueError(f"not a chunk id: {chunk_id!r}")
    return doc_id, version, int(ordinal)


def document_of(chunk_id: str) -> str:
    """The doc_id of a well-formed chunk ID, as split_chunk_id gives it, without checks:
    run per candidate on the search path, where every ID came from an index."""
    return chunk_id[: chunk_id.rindex("@")]


def documents_of(chunk_ids: Iterable[str]) -> dict[str, str]:
    """chunk ID -> doc_id for many IDs at once (document_of inlined: a search by document
    asks this of about a thousand IDs, and the calls were half its cost)."""
    return {c: c[: c.rindex("@")] for c in chunk_ids}


@dataclass(frozen=True)
class Caller:
    """An authenticated caller after policy resolution."""

    subject: str
    tenant: str
    region: str
    principals: frozenset[str]
    readable_regions: frozenset[str]
    reasons: tuple[str, ...] = field(default=())  # rule names that produced the principals
    # (principal, the rule that gave it), so an admin can be told why a document is visible.
    sources: tuple[tuple[str, str], ...] = field(default=())
    admin: bool = False  # an admin of `tenant` (the tenant-scoped /admin routes)
    operator: bool = False  # an operator of the deployment (the global /admin routes)
    kind: str = "user"  # "user" (a token from the identity provider) or "service" (an API key)
    # What an API key may do: "search" (the read routes) or "ingest" (the ingest routes of
    # its tenant); a token from the identity provider is not limited by scope ("any").
    scope: str = "any"
    # An ingest key may be limited to doc_ids starting with this prefix (None: any doc_id).
    doc_prefix: str | None = None

    def source_of(self, principal: str) -> str | None:
        return dict(self.sources).get(principal)

    @property
    def cache_scope(self) -> str:
        """Whose request-time caches an entry may serve: this caller's alone. A cache
        shared wider (a tenant) would let a colleague time whether someone just asked."""
        return f"{self.tenant}\x1f{self.kind}:{self.subject}"


# What a principal looks like: a kind, a colon, a name (user:ann, group:sales, support:eu).
PRINCIPAL_FORM = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*:\S.*")


def principal_problem(principal: str) -> str | None:
    """Why `principal` cannot be one, or None: a name by `name_problem`, of PRINCIPAL_FORM."""
    problem = name_problem(principal)
    if problem is None and not PRINCIPAL_FORM.fullmatch(principal):
        return "is not kind:name (e.g. user:ann, group:sales, support:eu)"
    return problem
