"""A claim's documents chunked at once and embedded a slice at a time (`SlicedEncoding`),
by the writer of ingest jobs (`gateway/ingest/claims.py`); with a handover, the slices
embedders handed over are taken instead (`gateway/ingest/handover.py`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from gateway.domain import Chunk, Document
from gateway.embedding import Embedder
from gateway.ingest.chunk import ChunkingOptions, chunk_document
from gateway.ingest.encoding import EmbedWatcher, Encoded, embed_chunks
from gateway.ingest.handover import Adopted, WriterHandover


class SlicedEncoding:
    """Documents chunked at once, embedded `embed_next(n)` chunks at a time; `result` joins
    the slices (the same chunks and vectors as one `encode` would give). With a
    `handover`, slices embedders handed over are taken instead of embedded, and those an
    embedder holds are left to it (`gateway/ingest/handover.py`)."""

    def __init__(
        self,
        documents: Sequence[Document],
        embedder: Embedder,
        options: ChunkingOptions,
        watcher: EmbedWatcher | None = None,
        handover: WriterHandover | None = None,
    ) -> None:
        self._embedder, self._watcher, self._handover = embedder, watcher, handover
        self._chunks = [
            c for d in documents for c in chunk_document(d, embedder.count_tokens, options)
        ]
        self._vectors = np.zeros((len(self._chunks), embedder.dim), dtype=np.float32)
        self._sentences: dict[str, bytes] = {}
        self._pending: dict[str, list[int]] = {}  # version key -> its chunks not yet embedded
        for i, chunk in enumerate(self._chunks):
            self._pending.setdefault(chunk.version_key, []).append(i)
        self._numerics: set[str] = set()
        if watcher is not None:
            watcher.planned(self._chunks)

    @property
    def chunks(self) -> Sequence[Chunk]:
        return self._chunks

    @property
    def done(self) -> bool:
        return not self._pending

    def embed_next(self, max_chunks: int) -> None:
        handover = self._handover
        if handover is None:
            keys: set[str] | None = None
        else:
            self._adopt(handover.adopt(self._chunks, self._pending))
            if self.done:
                return
            keys = handover.next_keys(self._pending, max(1, max_chunks))
        rows = [
            i
            for key, indices in self._pending.items()
            if keys is None or key in keys
            for i in indices
        ]
        # At most a slice a turn, even of one large version: the writer turns to the other
        # tenants in between (the handover keeps its claim on the rest meanwhile).
        rows = sorted(rows)[: max(1, max_chunks)]
        part = [self._chunks[i] for i in rows]
        started = time.perf_counter()
        if part:
            watcher = handover.watcher(self._watcher) if handover else self._watcher
            vectors, sentences = embed_chunks(self._embedder, part, False, watcher)
            self._vectors[rows] = vectors
            self._sentences.update(sentences)
            self._numerics.add(self._embedder.numerics.label)
            self._drop(rows)
        if handover is not None:
            # Marks the slices held that are embedded whole now, even those with nothing
            # left to embed.
            handover.embedded(len(part), time.perf_counter() - started, self._pending)

    def _adopt(self, adopted: Adopted) -> None:
        for i, (vector, sentences) in adopted.rows.items():
            self._vectors[i] = vector
            self._sentences[self._chunks[i].scoped_id] = sentences
        self._numerics |= adopted.numerics
        if self._watcher is not None and adopted.rows:
            self._watcher.embedded([self._chunks[i] for i in adopted.rows])
        self._drop(list(adopted.rows))

    def _drop(self, rows: Sequence[int]) -> None:
        gone = set(rows)
        for key in {self._chunks[i].version_key for i in gone}:
            left = [j for j in self._pending.get(key, []) if j not in gone]
            if left:
                self._pending[key] = left
            else:
                self._pending.pop(key, None)

    def result(self) -> Encoded:
        return Encoded(self._chunks, self._vectors, self._sentences, frozenset(self._numerics))
