"""Core value types shared by ingest, retrieval and the API."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

OPEN_END = dt.date.max  # effective_to of a version that has not been closed


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
        """`<doc_id>@<version>`: the identity of one version."""
        return f"{self.doc_id}@{self.version}"


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


def chunk_id_for(doc_id: str, version: str, ordinal: int) -> str:
    return f"{doc_id}@{version}:{ordinal}"


def split_chunk_id(chunk_id: str) -> tuple[str, str, int]:
    """Inverse of chunk_id_for; versions never contain '@' or ':' (refused at ingest)."""
    key, sep, ordinal = chunk_id.rpartition(":")
    doc_id, sep2, version = key.rpartition("@")
    if not sep or not sep2 or not doc_id or not ordinal.isdigit():
        raise ValueError(f"not a chunk id: {chunk_id!r}")
    return doc_id, version, int(ordinal)


@dataclass(frozen=True)
class Caller:
    """An authenticated caller after policy resolution."""

    subject: str
    tenant: str
    region: str
    principals: frozenset[str]
    readable_regions: frozenset[str]
    reasons: tuple[str, ...] = field(default=())  # rule names that produced the principals
