"""Ingest: validated documents -> chunks -> embeddings -> one new index generation.

Order matters for crash safety. Everything that can fail on bad input (parsing, validation)
happens before anything is written. The new generation is written beside the served one
(a hard-linked Tantivy copy, new LanceDB versions) and becomes visible only when the catalog
transaction that records it commits; a crash before that leaves the served generation as it
was, and the next ingest discards the leftovers.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from gateway.domain import Chunk, Document, Visibility
from gateway.embedding import Embedder, pack_vectors
from gateway.ingest.chunk import (
    DEFAULT_CHUNKING,
    ChunkingOptions,
    chunk_document,
    sentence_spans,
)
from gateway.ingest.parse import load_documents
from gateway.ingest.versions import Closure, VersionSpan, apply_closures, plan_closures
from gateway.storage.catalog import Catalog, DocumentRow, GenerationRow
from gateway.storage.generations import DataLayout, check_model, prune_lexical, snapshot_lexical
from gateway.storage.lexical import LexicalIndex
from gateway.storage.vectors import VectorStore


@dataclass(frozen=True)
class IngestReport:
    generation: int
    documents: int
    chunks: int
    closed: int
    seconds: float
    embed_seconds: float

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.embed_seconds if self.embed_seconds else 0.0


def content_hash(doc: Document) -> str:
    return hashlib.sha256(doc.text.encode()).hexdigest()


def ingest_paths(
    paths: Sequence[Path],
    layout: DataLayout,
    embedder: Embedder,
    options: ChunkingOptions = DEFAULT_CHUNKING,
    progress: bool = False,
) -> IngestReport:
    """Parse and validate every path (all-or-nothing), then write one generation."""
    return ingest_documents(load_documents(paths), layout, embedder, options, progress)


def ingest_documents(
    documents: Sequence[Document],
    layout: DataLayout,
    embedder: Embedder,
    options: ChunkingOptions = DEFAULT_CHUNKING,
    progress: bool = False,
) -> IngestReport:
    started = time.perf_counter()
    with layout.writer_lock():
        catalog = layout.open_catalog()
        current = catalog.current_generation()
        if current is not None:
            check_model(current, embedder.name, embedder.dim)

        existing = catalog.versions_of(d.doc_id for d in documents)
        closures = plan_closures([_span(r) for r in existing], documents)
        batch = apply_closures(documents, closures)
        batch_keys = {d.key for d in batch}
        # Existing versions that this batch closes: re-indexed with their new end date.
        closed_existing = {
            r.key: r for r in existing if r.key in closures and r.key not in batch_keys
        }
        reclosed_chunks = _rebuild_chunks(catalog, closed_existing, closures)

        chunks = [c for d in batch for c in chunk_document(d, embedder.count_tokens, options)]
        embed_started = time.perf_counter()
        vectors, sentence_vectors = _embed(embedder, chunks, progress)
        embed_seconds = time.perf_counter() - embed_started

        number = (current.id if current else 0) + 1
        lexical_dir = layout.lexical(number)
        snapshot_lexical(layout.root / current.lexical_dir if current else None, lexical_dir)
        LexicalIndex(lexical_dir).apply(
            delete_doc_keys=batch_keys | set(closed_existing), add=[*chunks, *reclosed_chunks]
        )

        store = VectorStore(layout.vectors, embedder.dim)
        if current is not None:
            store.reset_to(current.vector_version)
        vector_version = store.apply(
            delete_doc_keys=batch_keys,
            add=chunks,
            vectors=vectors,
            close=_closed_visibility(closed_existing, closures),
        )

        generation = GenerationRow(
            id=number,
            created_at=dt.datetime.now(dt.UTC),
            lexical_dir=str(lexical_dir.relative_to(layout.root)),
            vector_version=vector_version,
            model_name=embedder.name,
            dim=embedder.dim,
            documents=len(batch),
            chunks=len(chunks),
        )
        catalog.commit_generation(
            generation,
            [(d, content_hash(d)) for d in batch],
            chunks,
            sentence_vectors,
            {k: (c.effective_to, c.closed_by) for k, c in closures.items()},
        )
        prune_lexical(layout, number)
    return IngestReport(
        generation=number,
        documents=len(batch),
        chunks=len(chunks),
        closed=len(closures),
        seconds=time.perf_counter() - started,
        embed_seconds=embed_seconds,
    )


def _span(row: DocumentRow) -> VersionSpan:
    return VersionSpan(row.doc_id, row.version, row.effective_from, row.effective_to)


def _closed_visibility(
    rows: dict[str, DocumentRow], closures: dict[str, Closure]
) -> dict[str, Visibility]:
    return {
        key: replace(row.visibility, effective_to=closures[key].effective_to)
        for key, row in rows.items()
    }


def _rebuild_chunks(
    catalog: Catalog, rows: dict[str, DocumentRow], closures: dict[str, Closure]
) -> list[Chunk]:
    """Chunks of existing versions with their new end date, from the catalog's copy of the text."""
    out: list[Chunk] = []
    for key, row in rows.items():
        visibility = replace(row.visibility, effective_to=closures[key].effective_to)
        for c in catalog.chunks_of(row.doc_id, row.version):
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
                    visibility=visibility,
                )
            )
    return out


def _embed(
    embedder: Embedder, chunks: Sequence[Chunk], progress: bool
) -> tuple[np.ndarray, dict[str, bytes]]:
    """Chunk vectors, and each chunk's sentence vectors (packed) from the same pass."""
    texts, spans = [], []
    for chunk in chunks:
        prefix = embedding_prefix(chunk)
        texts.append(prefix + chunk.text)
        spans.append([(a + len(prefix), b + len(prefix)) for a, b in sentence_spans(chunk.text)])
    with tqdm(total=len(texts), unit="chunk", desc="embedding", disable=not progress) as bar:
        vectors, sentences = embedder.embed_with_spans(texts, spans, progress=bar.update)
    return vectors, {c.chunk_id: pack_vectors(s) for c, s in zip(chunks, sentences, strict=True)}


def embedding_prefix(chunk: Chunk) -> str:
    """The title travels with every chunk: it is often the only place a topic is named."""
    return f"{chunk.title}\n" if chunk.title else ""
