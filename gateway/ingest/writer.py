"""Write one index generation from a change set: the only path by which the index changes.

Ingest, delete, ACL changes and re-embedding all describe their change as a `ChangeSet`
(versions to add with embeddings, versions to remove, versions whose visibility changes
without re-embedding), planned under the data dir's writer lock from the catalog as it is.

Order matters for crash safety. Everything that can fail on bad input is checked before
anything is written. The new generation is written beside the served one (a hard-linked
Tantivy copy, new LanceDB table versions) and becomes visible only when the catalog
transaction that records it commits; a crash before that leaves the served generation as
it was, and the next write discards the leftovers.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from gateway.domain import Chunk, Document, Visibility, split_version_key
from gateway.embedding import Embedder
from gateway.ingest.chunk import DEFAULT_CHUNKING, ChunkingOptions
from gateway.ingest.encoding import Encoded, encode_added
from gateway.storage.catalog import Catalog, DocumentRow, GenerationRow, InTransaction, Revision
from gateway.storage.layout import DataLayout, check_model, prune_lexical, snapshot_lexical
from gateway.storage.lease import GenerationLock
from gateway.storage.partitions import LexicalIndex
from gateway.storage.vectors import store_outage_is_not_ready

# Every this many generations the writer compacts the vector table and deletes versions no
# kept generation pins (LanceDB's advice: optimize after about 20 modifications).
OPTIMIZE_EVERY = 20


@dataclass(frozen=True)
class ChangeSet:
    add: Sequence[Document] = ()  # versions (re)indexed with fresh embeddings
    delete: frozenset[str] = frozenset()  # doc keys removed
    revise: Mapping[str, Revision] = field(default_factory=dict)  # visibility only
    rebuild: bool = False  # a fresh index (new vector table): re-embedding everything

    @property
    def empty(self) -> bool:
        return not (self.add or self.delete or self.revise or self.rebuild)


@dataclass(frozen=True)
class GenerationReport:
    generation: int
    documents: int
    chunks: int
    revised: int
    deleted: int
    seconds: float
    embed_seconds: float
    tokens: int = 0  # word pieces of the chunks added
    unchanged: int = 0  # versions sent again exactly as stored: left as they were
    queued: int = 0  # versions of queued ingest jobs an ACL change or delete also applied to

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.embed_seconds if self.embed_seconds else 0.0


@dataclass(frozen=True)
class Plan:
    """A change planned under the writer lock, and what the planning found beside it."""

    changes: ChangeSet = field(default_factory=ChangeSet)
    unchanged: tuple[str, ...] = ()  # keys of versions sent again exactly as stored
    queued: int = 0  # records of queued ingest jobs an ACL change or delete also applied to


@dataclass(frozen=True)
class Written:
    """What `write_generation` did: the plan, and the generation written (None when the plan
    changed nothing: no generation is spent on a no-op)."""

    plan: Plan
    report: GenerationReport | None


def content_hash(doc: Document) -> str:
    return hashlib.sha256(doc.text.encode()).hexdigest()


def write_generation(
    layout: DataLayout,
    plan: Callable[[Catalog], Plan],
    *,
    embedder: Embedder | None = None,
    options: ChunkingOptions = DEFAULT_CHUNKING,
    progress: bool = False,
    ann_min_rows: int | None = None,
    encoded: Encoded | None = None,
    within: InTransaction | None = None,
) -> Written:
    """Plan the change under the writer lock and write it as one generation, unless the plan
    changes nothing; the report carries the plan's counts. Changes that embed nothing
    (delete, ACL) need no `embedder`: they keep the served generation's model. A vector
    table reaching `ann_min_rows` gets its IVF-PQ index in the same generation. With
    `encoded`, the added documents' chunks and vectors are taken as given (made before the
    lock was taken, or elsewhere than by the model), with the visibility the plan gives
    their documents; an added document they lack is embedded here. `within` joins the
    commit's transaction (see `Catalog.commit_generation`)."""
    started = time.perf_counter()
    with layout.writer_lock() as lock:
        catalog = layout.open_catalog()
        current = catalog.current_generation()
        planned = plan(catalog)
        changes = planned.changes
        if changes.empty:
            return Written(planned, None)
        model_name, dim = _model(current, changes, embedder)
        embed_started = time.perf_counter()
        added = encode_added(
            changes.add,
            embedder=embedder,
            encoded=encoded,
            options=options,
            progress=progress,
            dim=dim,
        )
        embed_seconds = time.perf_counter() - embed_started

        draft = _Draft(layout, catalog, current, changes, added, lock)
        lexical_dir = _write_lexical(draft)
        table, vector_version = _write_vectors(draft, dim, ann_min_rows)
        generation = GenerationRow(
            id=draft.number,
            created_at=dt.datetime.now(dt.UTC),
            lexical_dir=str(lexical_dir.relative_to(layout.root)),
            vector_table=table,
            vector_version=vector_version,
            model_name=model_name,
            dim=dim,
            documents=len(changes.add),
            chunks=len(added.chunks),
            precisions=_precisions(current, changes, _numerics(added, embedder)),
        )
        _commit(draft, generation, within)
    report = GenerationReport(
        generation=draft.number,
        documents=len(changes.add),
        chunks=len(added.chunks),
        revised=len(changes.revise),
        deleted=len(changes.delete),
        seconds=time.perf_counter() - started,
        embed_seconds=embed_seconds,
        tokens=sum(c.token_count for c in added.chunks),
        unchanged=len(planned.unchanged),
        queued=planned.queued,
    )
    return Written(planned, report)


def _model(
    current: GenerationRow | None, changes: ChangeSet, embedder: Embedder | None
) -> tuple[str, int]:
    """(name, dimension) of the model the generation's vectors come from: the embedder's,
    checked against the served generation's unless everything is embedded again; or, for a
    change that embeds nothing, the served generation's."""
    if embedder is None:
        if changes.add or changes.rebuild or current is None:
            raise ValueError("adding or rebuilding needs the embedding model")
        return current.model_name, current.dim
    if current is not None and not changes.rebuild:
        check_model(current, embedder.name, embedder.dim)
    return embedder.name, embedder.dim


def _numerics(added: Encoded, embedder: Embedder | None) -> set[str]:
    """The numerics of the vectors added: as their maker recorded them, else the writer's
    embedder's (vectors drawn around its embeddings, as `gateway bench --synthetic` does)."""
    if not added.chunks:
        return set()
    if added.numerics:
        return set(added.numerics)
    return {embedder.numerics.label} if embedder is not None else set()


def _precisions(current: GenerationRow | None, changes: ChangeSet, numerics: Iterable[str]) -> str:
    """The numerics of the generation's vectors: those it keeps from the served generation
    (none when everything is embedded again) and those of the vectors it adds (by the
    writer's embedder, or by embedders apart from it)."""
    kept = set() if current is None or changes.rebuild else set(current.precisions.split(","))
    kept |= set(numerics)
    return ",".join(sorted(kept - {""})) or "float32"


@dataclass(frozen=True)
class _Draft:
    """The generation being written, as each step (lexical, vectors, commit) reads it."""

    layout: DataLayout
    catalog: Catalog  # as it is until the commit
    current: GenerationRow | None  # served until the commit
    changes: ChangeSet
    added: Encoded  # of `changes.add`
    lock: GenerationLock | None  # the generation lock on PostgreSQL: checked, then committed on

    @property
    def number(self) -> int:
        return (self.current.id if self.current else 0) + 1

    @cached_property
    def added_keys(self) -> set[str]:
        return {d.key for d in self.changes.add}

    @cached_property
    def revised_in_place(self) -> dict[str, Revision]:
        """Revisions of versions not added again: their stored chunks get the new visibility
        without being embedded again."""
        return {k: r for k, r in self.changes.revise.items() if k not in self.added_keys}


def _write_lexical(draft: _Draft) -> Path:
    """The Tantivy step: a hard-linked copy of the served index (none for a rebuild) with
    the change applied, built in the writer's own directory, then put in place and
    published before the commit names it; its directory."""
    layout, current, changes = draft.layout, draft.current, draft.changes
    revised_chunks = _rebuild_chunks(draft.catalog, draft.revised_in_place)
    base = None if current is None or changes.rebuild else layout.local_lexical(current)
    with layout.lexical_build(draft.number, draft.lock) as build:
        snapshot_lexical(base, build)
        LexicalIndex(build).apply(
            delete_doc_keys=draft.added_keys | changes.delete | set(draft.revised_in_place),
            add=[*draft.added.chunks, *revised_chunks],
            catalog=None if base is None else _IndexedVersions(draft.catalog),
        )
        return layout.install_lexical(build, draft.number, draft.lock)


def _write_vectors(draft: _Draft, dim: int, ann_min_rows: int | None) -> tuple[str, int]:
    """The vector step (LanceDB, or the flat store): new versions of the served table, or a
    fresh table for a rebuild or the first generation; (table, version) for the commit."""
    with store_outage_is_not_ready():  # the store away is no fault of the jobs
        return _write_vectors_to_store(draft, dim, ann_min_rows)


def _write_vectors_to_store(draft: _Draft, dim: int, ann_min_rows: int | None) -> tuple[str, int]:
    layout, current, changes, number = draft.layout, draft.current, draft.changes, draft.number
    table = current.vector_table if current and not changes.rebuild else f"chunks_g{number:06d}"
    store = layout.open_vectors(dim, table=table)
    if current is not None and table == current.vector_table:
        store.reset_to(current.vector_version)  # drops versions a crashed writer left
    version = store.apply(
        delete_doc_keys=draft.added_keys | changes.delete,
        add=draft.added.chunks,
        vectors=draft.added.vectors,
        revise={k: r.visibility for k, r in draft.revised_in_place.items()},
    )
    if ann_min_rows is not None and store.ensure_ann_index(ann_min_rows):
        version = store.version
    if number % OPTIMIZE_EVERY == 0:
        version = layout.optimize_vectors(draft.catalog, number, store)
    layout.build_vector_copy(number, table, store)
    return table, version


def _commit(draft: _Draft, generation: GenerationRow, within: InTransaction | None) -> None:
    """The catalog transaction that makes `generation` the served one; then the lexical
    copies no kept generation needs any more."""
    changes = draft.changes
    draft.catalog.commit_generation(
        generation,
        documents=[(d, content_hash(d)) for d in changes.add],
        chunks=draft.added.chunks,
        sentence_vectors=draft.added.sentence_vectors,
        revised=changes.revise,
        deleted=changes.delete,
        within=within,
        lock=draft.lock,
    )
    # `draft.number`, not `generation.id`: the commit expired the row's attributes.
    draft.layout.mark_committed(draft.number)
    prune_lexical(draft.layout, draft.number)
    draft.layout.prune_published(draft.number, draft.catalog.replicas.oldest_served())


class _IndexedVersions:
    """The catalog before this generation's commit: the versions the base index holds."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    def tenants(self) -> list[str]:
        return self._catalog.tenants()

    def visibilities(
        self, tenant: str, versions: set[tuple[str, str]]
    ) -> dict[tuple[str, str], Visibility]:
        every = self._catalog.visibilities(tenant)
        return {(d, v): seen for d, v, seen in every if (d, v) in versions}


def _rebuild_chunks(catalog: Catalog, revised: Mapping[str, Revision]) -> list[Chunk]:
    """Chunks of existing versions with their new visibility, from the catalog's copy of the
    text: re-indexed in Tantivy without touching the model."""
    out: list[Chunk] = []
    keys = [split_version_key(k) for k in revised]
    rows: dict[str, DocumentRow] = {
        r.key: r for r in catalog.versions_of((tenant, doc_id) for tenant, doc_id, _ in keys)
    }
    for key, revision in revised.items():
        row = rows.get(key)
        if row is None:
            continue
        for c in catalog.chunks_of(row.tenant, row.doc_id, row.version):
            out.append(
                Chunk(
                    chunk_id=c.chunk_id,
                    doc_id=c.doc_id,
                    version=c.version,
                    ordinal=c.ordinal,
                    title=row.title,
                    uri=row.uri,
                    text=c.text,
                    token_count=c.token_count,
                    visibility=revision.visibility,
                    parent=c.parent,
                )
            )
    return out
