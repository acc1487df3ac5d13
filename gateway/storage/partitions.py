"""A generation's lexical index: one Tantivy index per tenant, so no ranking statistic of
one tenant depends on another tenant's content.

BM25 weighs a term by how many documents hold it and a document by its length against the
average, both over the whole index it searches. In one shared index, another tenant's
documents moved a caller's scores and order (a score ratio went from 1.0 to 6.1 when 50
hidden chunks were added) and the lane's time with their volume. Each tenant's chunks
live in their own directory under the generation's, named by a hash of the tenant; a
search reads only the caller's. What remains is within a tenant: its documents a caller
may not see still count in its statistics (docs/security.md, "Ranking statistics per
tenant").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

from gateway.domain import Chunk, Visibility, split_chunk_id, split_version_key
from gateway.restriction import Restriction
from gateway.storage.lexical import (
    LexicalHit,
    StoredChunk,
    TantivyIndex,
    has_rows,
    identifiers_in,
)
from gateway.storage.whole import whole_documents

log = logging.getLogger("gateway.storage")
PARTITION_PREFIX = "t-"
DOCUMENTS_PREFIX = "d-"  # the tenant's whole documents, for document-level BM25
# Beside each `d-<hash>/`: a digest of the tenant's chunk partition's meta.json as it was
# when the document partition last took the same changes. A writer of an earlier release
# commits chunks only; the digest then differs, and the documents are not used (nor kept).
SYNCED_SUFFIX = ".synced"
_SEGMENT_FILE = re.compile(r"^([0-9a-f]{32})\.")  # `<segment uuid>.<part>[.<opstamp>.del]`


def chunks_first(name: str) -> tuple[bool, str]:
    """A sort key of partition names: chunk partitions (every search reads one) before
    document partitions (only a search by document does)."""
    return name.startswith(DOCUMENTS_PREFIX), name


def partition_name(tenant: str, prefix: str = PARTITION_PREFIX) -> str:
    """A directory name for any tenant string (no path syntax can reach the file system)."""
    return prefix + hashlib.sha256(tenant.encode()).hexdigest()[:32]


class KnownVersions(Protocol):
    """What the catalog knows of the versions an index holds: enough to index, from the
    stored chunks, the whole documents of an index written by an earlier release."""

    def tenants(self) -> Iterable[str]: ...

    def visibilities(
        self, tenant: str, versions: set[tuple[str, str]]
    ) -> dict[tuple[str, str], Visibility]: ...


class GenerationRemoved(RuntimeError):
    """The generation a search holds was removed from disk (pruned, or freed after an
    erasure) before the search opened its tenant's partition. An empty answer from it
    would look complete; the lane fails instead, and says so (`degraded`)."""


class LexicalIndex:
    """A generation directory of per-tenant Tantivy indexes, opened as first needed."""

    def __init__(self, path: Path, create: bool = True) -> None:
        """`create`: make the directory if it is missing (a writer's new generation); a
        reader's generation is never made again where it was removed."""
        if create:
            path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._open: dict[str, TantivyIndex] = {}
        self._in_step: dict[str, bool] = {}  # tenant -> its document partition is usable
        self._written_again_without_rows: set[str] = set()  # chunk partitions (`erase`)
        self._lock = threading.Lock()

    def _partition(
        self, tenant: str, create: bool = False, prefix: str = PARTITION_PREFIX
    ) -> TantivyIndex | None:
        name = partition_name(tenant, prefix)
        found = self._open.get(name)
        if found is not None:
            return found
        directory = self.path / name
        if not create and not directory.exists():
            self._check_generation()
            return None  # a tenant without documents in this generation
        with self._lock:  # one opening per partition
            if name not in self._open:
                documents = prefix == DOCUMENTS_PREFIX
                try:
                    rows = self._made_with_rows(name)
                    self._open[name] = TantivyIndex(directory, documents, create=create, rows=rows)
                except (OSError, ValueError) as exc:  # tantivy-py raises ValueError for all
                    if create:
                        raise
                    self._check_generation()
                    if isinstance(exc, FileNotFoundError):
                        return None  # its partition removed since it was seen, not the generation
                    raise
            return self._open[name]

    def _made_with_rows(self, name: str) -> bool:
        """Whether the partition `name`, if made now, numbers its rows. Not where a server
        of an earlier release may still read the tenant (it opens an index only in the
        schema it knows): a chunk partition an erasure writes again keeps the schema it
        had, and a document partition takes the schema of the chunk partition beside it."""
        if name.startswith(DOCUMENTS_PREFIX):
            return has_rows(self.path / (PARTITION_PREFIX + name[len(DOCUMENTS_PREFIX) :]))
        return name not in self._written_again_without_rows

    def _check_generation(self) -> None:
        """A partition not on disk is a tenant without documents in this generation,
        unless the generation itself is gone (`layout.remove_generation` removes it
        whole): then no answer from it is true."""
        if not self.path.is_dir():
            raise GenerationRemoved(f"generation {self.path.name} was removed from disk")

    def open_partitions(
        self,
        names: Iterable[str] | None = None,
        keep_going: Callable[[], bool] = lambda: True,
        previous: LexicalIndex | None = None,
    ) -> list[str]:
        """Open the partitions named (None: every chunk partition on disk, and every
        document partition in step with its chunks) ahead of the searches that would open
        them, each reading its row names: 0.15-0.2 s for a tenant of a million chunks,
        which its first search would otherwise spend inside its budget, and less where
        `previous` (the generation before) has it open: its row names' files are then
        taken as they are. Chunk partitions first (every search reads one); until
        `keep_going()` is false. One that fails to open is left to the searches that need
        it, which then fail as before."""
        wanted = self._partition_dirs() if names is None else names
        opened = []
        for name in sorted(wanted, key=chunks_first):
            if not keep_going():
                break
            if name not in self._open:
                directory = self.path / name
                if not directory.is_dir():
                    continue  # a tenant with no documents left in this generation
                documents = name.startswith(DOCUMENTS_PREFIX)
                if documents and not self._in_step_by_name(name):
                    continue  # behind its chunks: no search uses it
                try:  # not under the lock: a search opening another partition goes on
                    before = previous._open.get(name) if previous is not None else None
                    index = TantivyIndex(directory, documents, before, create=False)
                except Exception as exc:
                    log.warning("partition %s not opened ahead (%s)", name, type(exc).__name__)
                    continue
                with self._lock:
                    self._open.setdefault(name, index)
            opened.append(name)
        return opened

    @property
    def opened(self) -> list[str]:
        """The partitions opened so far: those the searches of this process have needed."""
        with self._lock:
            return list(self._open)

    def _partition_dirs(self) -> list[str]:
        """The partition directories of this generation."""
        return [
            entry.name
            for entry in self.path.iterdir()
            if entry.is_dir() and entry.name.startswith((PARTITION_PREFIX, DOCUMENTS_PREFIX))
        ]

    # -- writes -------------------------------------------------------------------------

    def apply(
        self,
        delete_doc_keys: Iterable[str],
        add: Sequence[Chunk],
        catalog: KnownVersions | None = None,
    ) -> None:
        """Delete whole document versions and add chunks, one commit per tenant touched,
        and the same to the tenants' whole-document partitions. The generation becomes
        visible only when the catalog records it, so per-tenant commits never show half a
        change. With `catalog` (the versions the unchanged index holds), a tenant indexed
        before documents were gets its document partition first, from its stored chunks."""
        deletes: dict[str, list[str]] = defaultdict(list)
        for key in delete_doc_keys:
            deletes[split_version_key(key)[0]].append(key)
        adds: dict[str, list[Chunk]] = defaultdict(list)
        for chunk in add:
            adds[chunk.visibility.tenant].append(chunk)
        if catalog is not None:  # (a tenant now written to, even with no versions left)
            self._index_documents_of_earlier_releases(catalog, adds.keys())
        for tenant in sorted(deletes.keys() | adds.keys()):
            created = not (self.path / partition_name(tenant)).exists()
            partition = self._partition(tenant, create=bool(adds.get(tenant)))
            if partition is None:
                continue
            # Decided before the chunks change: the digest is of the chunks as they were.
            documents = self._documents(tenant, create=created)
            partition.apply(deletes.get(tenant, ()), adds.get(tenant, ()))
            if documents is not None:  # (None: indexed before documents were, no catalog)
                documents.apply(deletes.get(tenant, ()), whole_documents(adds.get(tenant, ())))
                self._mark_in_step(tenant)

    def _index_documents_of_earlier_releases(
        self, catalog: KnownVersions, written: Iterable[str]
    ) -> None:
        for tenant in sorted({*catalog.tenants(), *written}):
            if self._usable(tenant):
                continue
            self._drop_documents(tenant)  # (behind its chunks: an earlier release wrote)
            chunks = self._partition(tenant)
            if chunks is None:
                continue
            stored = list(chunks.stored_chunks())
            seen = catalog.visibilities(tenant, {(c.doc_id, c.version) for c in stored})
            whole = whole_documents(
                Chunk(c.chunk_id, c.doc_id, c.version, split_chunk_id(c.chunk_id)[2], c.title,
                      c.uri, c.text, 0, seen[(c.doc_id, c.version)])
                for c in stored
                if (c.doc_id, c.version) in seen
            )  # fmt: skip
            documents = self._partition(tenant, create=True, prefix=DOCUMENTS_PREFIX)
            assert documents is not None
            documents.apply((), whole)
            self._mark_in_step(tenant)

    def _documents(self, tenant: str, create: bool = False) -> TantivyIndex | None:
        """The tenant's whole-document partition, if it holds what its chunk partition
        does (or `create`: a new tenant's, made beside its new chunk partition)."""
        if create:
            return self._partition(tenant, create=True, prefix=DOCUMENTS_PREFIX)
        return self._partition(tenant, prefix=DOCUMENTS_PREFIX) if self._usable(tenant) else None

    def _usable(self, tenant: str) -> bool:
        """The tenant's document partition exists and is in step with its chunks; decided
        without opening it (a write checks every tenant's)."""
        in_step = self._in_step.get(tenant)
        if in_step is None:  # once per tenant: a search asks on every request
            in_step = self._in_step_by_name(partition_name(tenant, DOCUMENTS_PREFIX))
            self._in_step[tenant] = in_step
        return in_step

    def _in_step_by_name(self, documents: str) -> bool:
        """Whether the document partition named `documents` exists and took the same
        changes as the chunk partition beside it (its `.synced` digest is of that one's
        meta.json)."""
        chunks = PARTITION_PREFIX + documents[len(DOCUMENTS_PREFIX) :]
        try:
            meta = (self.path / chunks / "meta.json").read_bytes()
            synced = (self.path / (documents + SYNCED_SUFFIX)).read_text().strip()
        except FileNotFoundError:
            return False
        return synced == hashlib.sha256(meta).hexdigest() and (self.path / documents).is_dir()

    def _chunks_digest(self, tenant: str) -> str | None:
        try:
            meta = (self.path / partition_name(tenant) / "meta.json").read_bytes()
        except FileNotFoundError:
            return None
        return hashlib.sha256(meta).hexdigest()

    def _synced_path(self, tenant: str) -> Path:
        return self.path / (partition_name(tenant, DOCUMENTS_PREFIX) + SYNCED_SUFFIX)

    def _mark_in_step(self, tenant: str) -> None:
        # Replaced, not rewritten: the file is hard-linked from the generation before.
        digest = self._chunks_digest(tenant)
        assert digest is not None, "a document partition beside no chunk partition"
        handle, staged = tempfile.mkstemp(dir=self.path, prefix=".synced-")
        with os.fdopen(handle, "w") as out:
            out.write(f"{digest}\n")
        os.replace(staged, self._synced_path(tenant))
        self._in_step[tenant] = True

    def _drop_documents(self, tenant: str) -> None:
        with self._lock:
            self._open.pop(partition_name(tenant, DOCUMENTS_PREFIX), None)
        shutil.rmtree(self.path / partition_name(tenant, DOCUMENTS_PREFIX), ignore_errors=True)
        self._synced_path(tenant).unlink(missing_ok=True)
        self._in_step.pop(tenant, None)

    # -- erasure ------------------------------------------------------------------------

    def erase(
        self, tenants: Iterable[str], chunks_of: Callable[[str], Iterable[Sequence[Chunk]]]
    ) -> int:
        """Make this generation's files hold nothing deleted (docs/security.md, "Erasure"):
        Tantivy only marks a deleted document, its text and terms stay in the segment
        until a merge, which tantivy-py cannot ask for. So a tenant's partitions with any
        deletes, or with rows files naming chunks they no longer hold, are written again
        from `chunks_of(tenant)` (the catalog's chunks, in batches that never split a
        version), in the schema they had (`_made_with_rows`); a tenant that `tenants` no
        longer names loses its partitions, and files no segment uses (left by merges) are
        removed. Run on a generation no one serves yet; how many tenants were written
        again."""
        by_hash = {partition_name(t)[len(PARTITION_PREFIX) :]: t for t in tenants}
        hashes = {name[len(PARTITION_PREFIX) :] for name in self._partition_dirs()}
        rebuilt = 0
        for digest in sorted(hashes):
            tenant = by_hash.get(digest)
            chunks = self.path / f"{PARTITION_PREFIX}{digest}"
            documents = self.path / f"{DOCUMENTS_PREFIX}{digest}"
            if tenant is not None and not any(
                _has_deletes(d) or _names_more_than_it_holds(d) for d in (chunks, documents)
            ):
                _remove_unused_files(chunks)
                _remove_unused_files(documents)
                continue
            rows = has_rows(chunks)
            for directory in (chunks, documents):
                shutil.rmtree(directory, ignore_errors=True)
            self.path.joinpath(documents.name + SYNCED_SUFFIX).unlink(missing_ok=True)
            if tenant is None:
                continue
            with self._lock:
                if not rows:
                    self._written_again_without_rows.add(chunks.name)
                self._open.pop(chunks.name, None)
                self._open.pop(documents.name, None)
                self._in_step.pop(tenant, None)
            for batch in chunks_of(tenant):
                self.apply((), batch)
            rebuilt += 1
        return rebuilt

    # -- reads: the caller's partition only ---------------------------------------------

    def search(
        self, restriction: Restriction, text: str, limit: int, stored: int = 0
    ) -> list[LexicalHit]:
        partition = self._partition(restriction.tenant)
        return [] if partition is None else partition.search(restriction, text, limit, stored)

    def search_documents(
        self, restriction: Restriction, text: str, limit: int
    ) -> list[LexicalHit] | None:
        """BM25 over whole documents in the restricted universe, each hit named by its
        document's first chunk; None when this generation has no document index."""
        partition = self._documents(restriction.tenant)
        return None if partition is None else partition.search(restriction, text, limit)

    def search_identifiers(
        self, restriction: Restriction, text: str, limit: int
    ) -> list[LexicalHit]:
        partition = self._partition(restriction.tenant)
        return [] if partition is None else partition.search_identifiers(restriction, text, limit)

    def fetch(self, restriction: Restriction, chunk_ids: Sequence[str]) -> dict[str, StoredChunk]:
        partition = self._partition(restriction.tenant)
        return {} if partition is None else partition.fetch(restriction, chunk_ids)

    def filter_only(self, restriction: Restriction, limit: int = 1_000_000) -> set[str]:
        partition = self._partition(restriction.tenant)
        return set() if partition is None else partition.filter_only(restriction, limit)

    def identifiers(self, text: str) -> list[str]:
        return identifiers_in(text)

    def count(self) -> int:
        """Chunks in every partition."""
        partitions = sorted(self.path.glob(f"{PARTITION_PREFIX}*"))
        return sum(TantivyIndex(d, create=False).count() for d in partitions)


def _segments(directory: Path) -> list[dict[str, object]] | None:
    try:
        meta = json.loads((directory / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    segments: list[dict[str, object]] = meta.get("segments", [])
    return segments


def _has_deletes(directory: Path) -> bool:
    """Whether a Tantivy directory has a segment with documents only marked deleted."""
    segments = _segments(directory)
    return bool(segments) and any(s.get("deletes") for s in segments or ())


def _names_more_than_it_holds(directory: Path) -> bool:
    """Whether a partition's rows files still name chunks it no longer holds (a segment
    whose every document was deleted is dropped whole, with no delete left to see)."""
    if not directory.is_dir():
        return False
    whole = directory.name.startswith(DOCUMENTS_PREFIX)
    return TantivyIndex(directory, documents=whole, create=False).names_more_than_it_holds()


def _remove_unused_files(directory: Path) -> None:
    """Remove segment files meta.json does not name (a merge's inputs not yet collected)."""
    segments = _segments(directory)
    if segments is None:
        return
    used = {str(s["segment_id"]).replace("-", "") for s in segments}
    for entry in directory.iterdir():
        found = _SEGMENT_FILE.match(entry.name)
        if found and found.group(1) not in used:
            entry.unlink()
