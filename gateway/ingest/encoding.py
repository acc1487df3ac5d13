"""Chunk and embed the versions a generation adds: their chunks, one vector per chunk, and
each chunk's sentence vectors (pooled in the same pass, for late chunking).

Done under the writer lock by `write_generation`, or ahead of it (outside the lock) by the
writer of ingest jobs, so that ACL changes and deletes are not held up behind the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from gateway.domain import Chunk, Document
from gateway.embedding import Embedder, pack_vectors
from gateway.ingest.chunk import DEFAULT_CHUNKING, ChunkingOptions, chunk_document, sentence_spans
from gateway.telemetry.progress import Progress


class EmbedWatcher(Protocol):
    """Hears which chunks are to be embedded, then which each batch embedded (batches go
    by text length, not in the order given)."""

    def planned(self, chunks: Sequence[Chunk]) -> None: ...

    def embedded(self, chunks: Sequence[Chunk]) -> None: ...


@dataclass(frozen=True)
class Encoded:
    """Chunks of the added documents with their vectors: made by `encode`, or elsewhere than
    by the model (`gateway bench --synthetic` draws them around real embeddings)."""

    chunks: Sequence[Chunk]
    vectors: np.ndarray  # one row per chunk
    sentence_vectors: Mapping[str, bytes]  # `Chunk.scoped_id` -> packed vectors of its sentences
    # The numerics its vectors were made in (`Numerics.label`), when made by embedders
    # apart from the writer (`gateway/ingest/handover.py`); the generation records them.
    numerics: frozenset[str] = frozenset()


def encode_added(
    add: Sequence[Document],
    *,
    embedder: Embedder | None,
    encoded: Encoded | None,
    options: ChunkingOptions,
    progress: bool,
    dim: int,
    watcher: EmbedWatcher | None = None,
) -> Encoded:
    """Chunks, vectors and sentence vectors of the added versions: those `encoded` brings
    (given the visibility planned for their version), the rest chunked and embedded (with
    no `embedder`, none are)."""
    chunks: list[Chunk] = []
    vectors = np.zeros((0, dim), dtype=np.float32)
    sentence_vectors: dict[str, bytes] = {}
    numerics: frozenset[str] = frozenset()
    planned = {d.key: d for d in add}
    if encoded is not None:
        numerics = encoded.numerics
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
        if watcher is not None:
            watcher.planned(more)
        more_vectors, more_sentences = embed_chunks(embedder, more, progress, watcher)
        chunks += more
        vectors = np.vstack([vectors, more_vectors]) if len(vectors) else more_vectors
        sentence_vectors.update(more_sentences)
        numerics |= {embedder.numerics.label}
    return Encoded(chunks, vectors, sentence_vectors, numerics)


def encode(
    documents: Sequence[Document],
    embedder: Embedder,
    options: ChunkingOptions = DEFAULT_CHUNKING,
    progress: bool = False,
    watcher: EmbedWatcher | None = None,
) -> Encoded:
    """Chunk and embed documents ahead of a write (e.g. outside the writer lock)."""
    return encode_added(
        documents,
        embedder=embedder,
        encoded=None,
        options=options,
        progress=progress,
        dim=embedder.dim,
        watcher=watcher,
    )


def embed_chunks(
    embedder: Embedder,
    chunks: Sequence[Chunk],
    progress: bool,
    watcher: EmbedWatcher | None = None,
) -> tuple[np.ndarray, dict[str, bytes]]:
    """Chunk vectors, and each chunk's sentence vectors (packed) from the same pass; the
    watcher hears of each batch embedded (of what was planned, it was told before)."""
    texts, spans = embedded_texts(chunks)
    with Progress(len(texts), "embedding", "chunk", enabled=progress) as shown:

        def advance(rows: Sequence[int]) -> None:
            shown.update(len(rows))
            if watcher is not None:
                watcher.embedded([chunks[i] for i in rows])

        vectors, sentences = embedder.embed_with_spans(texts, spans, progress=advance)
    return vectors, {c.scoped_id: pack_vectors(s) for c, s in zip(chunks, sentences, strict=True)}


def embedded_texts(
    chunks: Sequence[Chunk],
) -> tuple[list[str], list[list[tuple[int, int]]]]:
    """What the model reads of each chunk (its title, then its text), and where in that its
    sentences are (character spans), for the sentence vectors pooled from the same pass."""
    texts, spans = [], []
    for chunk in chunks:
        prefix = embedding_prefix(chunk)
        texts.append(prefix + chunk.text)
        spans.append([(a + len(prefix), b + len(prefix)) for a, b in sentence_spans(chunk.text)])
    return texts, spans


def embedding_prefix(chunk: Chunk) -> str:
    """The title travels with every chunk: it is often the only place a topic is named."""
    return f"{chunk.title}\n" if chunk.title else ""
