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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from gateway.domain import Chunk, Document, Visibility, split_version_key
from gateway.embedding import Embedder, pack_vectors
from gateway.ingest.chunk import DEFAULT_CHUNKING, ChunkingOptions, chunk_document, sentence_spans
from gateway.storage.catalog import Catalog, DocumentRow, GenerationRow, InTransaction, Revision
from gateway.storage.layout import DataLayout, check_model, prune_lexical, snapshot_lexical
from gateway.storage.partitions import LexicalIndex
from gateway.storage.vectors import DEFAULT_TABLE
from gateway.telemetry.progress import Progress

# Every this many generations the writer compacts the vector table and deletes versions no
# kept generation pins (LanceDB's advice: optimize after about 20 modifications).
OPTIMIZE_EVERY = 20


class EmbedWatcher(Protocol):
    """Hears which chunks are to be embedded, then which each batch embedded (batches go
    by text length, not in the order given)."""

    def planned(self, chunks: Sequence[Chunk]) -> None: ...

    def embedded(self, chunks: Sequence[Chunk]) -> None: ...


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
class Encoded:
    """Chunks of the added documents with their vectors, made elsewhere than by the model
    (`gateway bench --synthetic` draws them around real embeddings); ingest makes its own."""

    chunks: Sequence[Chunk]
    vectors: np.ndarray  # one row per chunk
    sentence_vectors: Mapping[str, bytes]  # `Chunk.scoped_id` -> packed vectors of its sentences


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


def content_hash(doc: Document) -> str:
    return hashlib.sha256(doc.text.encode()).hexdigest()


def write_generation(
    layout: DataLayout,
    embedder: Embedder | None,
    plan: Callable[[Catalog], ChangeSet],
    options: ChunkingOptions = DEFAULT_CHUNKING,
    progress: bool = False,
    ann_min_rows: int | None = None,
    encoded: Encoded | None = None,
    within: InTransaction | None = None,
) -> GenerationReport | None:
    """Plan the change under the writer lock and write it as one generation; None when the
    plan changes nothing (no generation is spent on a no-op). Changes that embed nothing
    (delete, ACL) need no `embedder`: they keep the served generation's model. A vector
    table reaching `ann_min_rows` gets its IVF-PQ index in the same generation. With
    `encoded`, the added documents' chunks and vectors are taken as given (made before the
    lock was taken, or elsewhere than by the model), with the visibility the plan gives
    their documents; an added document they lack is embedded here. `within` joins the
    commit's transaction (see `Catalog.commit_generation`)."""
    started = time.perf_counter()
    with layout.writer_lock():
        catalog = layout.open_catalog()
        current = catalog.current_generation()
        changes = plan(catalog)
        if changes.empty:
            return None
        if embedder is None:
            if changes.add or changes.rebuild or current is None:
                raise ValueError("adding or rebuilding needs the embedding model")
            model_name, dim = current.model_name, current.dim
        else:
            model_name, dim = embedder.name, embedder.dim
            if current is not None and not changes.rebuild:
                check_model(current, model_name, dim)

        embed_started = time.perf_counter()
        chunks, vectors, sentence_vectors = _encode(
            changes.add, embedder, encoded, options, progress, dim
        )
        embed_seconds = time.perf_counter() - embed_started

        added = {d.key for d in changes.add}
        revised_elsewhere = {k: r for k, r in changes.revise.items() if k not in added}
        revised_chunks = _rebuild_chunks(catalog, revised_elsewhere)
        number = (current.id if current else 0) + 1
        lexical_dir = layout.lexical(number)
        base = None if current is None or changes.rebuild else layout.local_lexical(current)
        snapshot_lexical(base, lexical_dir)
        LexicalIndex(lexical_dir).apply(
            delete_doc_keys=added | changes.delete | set(revised_elsewhere),
            add=[*chunks, *revised_chunks],
            catalog=None if base is None else _IndexedVersions(catalog),
        )
        layout.publish_lexical(number)  # in the object store before the commit names it

        table = f"chunks_g{number:06d}" if changes.rebuild or current is None else None
        table = table or (current.vector_table if current else DEFAULT_TABLE)
        store = layout.open_vectors(dim, table=table)
        if current is not None and table == current.vector_table:
            store.reset_to(current.vector_version)
        vector_version = store.apply(
            delete_doc_keys=added | changes.delete,
            add=chunks,
            vectors=vectors,
            revise={k: r.visibility for k, r in revised_elsewhere.items()},
        )
        if ann_min_rows is not None and store.ensure_ann_index(ann_min_rows):
            vector_version = store.version
        if number % OPTIMIZE_EVERY == 0:
            vector_version = layout.optimize_vectors(catalog, number, store)
        generation = GenerationRow(
            id=number,
            created_at=dt.datetime.now(dt.UTC),
            lexical_dir=str(lexical_dir.relative_to(layout.root)),
            vector_table=table,
            vector_version=vector_version,
            model_name=model_name,
            dim=dim,
            documents=len(changes.add),
            chunks=len(chunks),
        )
        catalog.commit_generation(
            generation,
            [(d, content_hash(d)) for d in changes.add],
            chunks,
            sentence_vectors,
            changes.revise,
            changes.delete,
            within,
        )
        prune_lexical(layout, number)
        layout.prune_published(number, catalog.replicas.oldest_served())
    return GenerationReport(
        generation=number,
        documents=len(changes.add),
        chunks=len(chunks),
        revised=len(changes.revise),
        deleted=len(changes.delete),
        seconds=time.perf_counter() - started,
        embed_seconds=embed_seconds,
        tokens=sum(c.token_count for c in chunks),
    )


def _encode(
    add: Sequence[Document],
    embedder: Embedder | None,
    encoded: Encoded | None,
    options: ChunkingOptions,
    progress: bool,
    dim: int,
    watcher: EmbedWatcher | None = None,
) -> tuple[list[Chunk], np.ndarray, dict[str, bytes]]:
    """Chunks, vectors and sentence vectors of the added versions: those `encoded` brings
    (given the visibility planned for their version), the rest chunked and embedded."""
    chunks: list[Chunk] = []
    vectors = np.zeros((0, dim), dtype=np.float32)
    sentence_vectors: dict[str, bytes] = {}
    planned = {d.key: d for d in add}
    if encoded is not None:
        keep = [i for i, c in enumerate(encoded.chunks) if c.version_key in planned]
        chunks = [
            replace(c, visibility=planned[c.version_key].visibility)
            for c in (encoded.chunks[i] for i in keep)
        ]
        vectors = encoded.vectors[keep]
        sentence_vectors = {
            c.scoped_id: encoded.sentence_vectors[c.scoped_id]
            for c in chunks
            if c.scoped_id in encoded.sentence_vectors
        }
    have = {c.version_key for c in chunks}
    todo = [d for d in add if d.key not in have]
    if todo and embedder is not None:
        more = [c for d in todo for c in chunk_document(d, embedder.count_tokens, options)]
        more_vectors, more_sentences = _embed(embedder, more, progress, watcher)
        chunks += more
        vectors = np.vstack([vectors, more_vectors]) if len(vectors) else more_vectors
        sentence_vectors.update(more_sentences)
    return chunks, vectors, sentence_vectors


def encode(
    documents: Sequence[Document],
    embedder: Embedder,
    options: ChunkingOptions = DEFAULT_CHUNKING,
    progress: bool = False,
    watcher: EmbedWatcher | None = None,
) -> Encoded:
    """Chunk and embed documents ahead of a write (e.g. outside the writer lock)."""
    chunks, vectors, sentence_vectors = _encode(
        documents, embedder, None, options, progress, embedder.dim, watcher
    )
    return Encoded(chunks, vectors, sentence_vectors)


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


def _embed(
    embedder: Embedder,
    chunks: Sequence[Chunk],
    progress: bool,
    watcher: EmbedWatcher | None = None,
) -> tuple[np.ndarray, dict[str, bytes]]:
    """Chunk vectors, and each chunk's sentence vectors (packed) from the same pass."""
    texts, spans = [], []
    for chunk in chunks:
        prefix = embedding_prefix(chunk)
        texts.append(prefix + chunk.text)
        spans.append([(a + len(prefix), b + len(prefix)) for a, b in sentence_spans(chunk.text)])
    if watcher is not None:
        watcher.planned(chunks)
    with Progress(len(texts), "embedding", "chunk", enabled=progress) as shown:

        def advance(rows: Sequence[int]) -> None:
            shown.update(len(rows))
            if watcher is not None:
                watcher.embedded([chunks[i] for i in rows])

        vectors, sentences = embedder.embed_with_spans(texts, spans, progress=advance)
    return vectors, {c.scoped_id: pack_vectors(s) for c, s in zip(chunks, sentences, strict=True)}


def embedding_prefix(chunk: Chunk) -> str:
    """The title travels with every chunk: it is often the only place a topic is named."""
    return f"{chunk.title}\n" if chunk.title else ""
