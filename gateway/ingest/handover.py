"""The committing writer's side of the embedding handover (`gateway/storage/slices.py`).

A claim's chunks are embedded at most `ingest.slice_chunks` a turn, as before; where
embedders run (`gateway worker --embed-only`, `gateway/ingest/embedder.py`), a slice an
embedder has handed over is taken instead of embedded, and a slice an embedder holds is
left to it. A slice is planned of whole versions, so one large document is one slice of
many chunks: the writer keeps its claim on such a slice across turns (its claims share
one token per process, renewed while it embeds for any tenant) and embeds a turn's worth
of it each time, so another tenant waits for one turn at most. The writer chunks every
document itself with the policy it commits with, and takes a handed-over vector only for
a chunk of the same ID whose embedded text (title prefix and chunk text) has the same
digest, from the same model name and dimension (invariant 12: vectors of another model
are refused, loudly, and embedded again), made with the same chunking options, and, when
`GATEWAY_EMBEDDING_PRECISION` is forced, in that dtype; anything else it embeds itself.
Without embedders the writer plans, claims and embeds every slice itself: the same chunks
and vectors as before.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gateway.domain import Chunk
from gateway.embedding import Embedder
from gateway.embedding.precision import Numerics
from gateway.ingest.chunk import ChunkingOptions
from gateway.ingest.encoding import EmbedWatcher, embedding_prefix
from gateway.storage.slices import (
    MAX_EMBEDDER_CLAIMS,
    EmbedSlices,
    PlannedSlice,
    claim_token,
)

log = logging.getLogger("gateway.worker")
DIGEST_BYTES = 16
HEARTBEAT_EVERY_S = 2.0
WAIT_S = 0.2  # the writer's pause when every slice left is in an embedder's hands


def chunking_of(options: ChunkingOptions) -> str:
    """What a slice records of the chunking it was planned and embedded with."""
    return json.dumps(options.model_dump(), sort_keys=True)


def digest(chunk: Chunk) -> bytes:
    """Names the exact text a chunk's vector is embedded from (never stored as text)."""
    return hashlib.sha256((embedding_prefix(chunk) + chunk.text).encode()).digest()[:DIGEST_BYTES]


def plan_slices(chunks: Sequence[Chunk], max_chunks: int) -> list[PlannedSlice]:
    """Consecutive document versions, about `max_chunks` chunks a slice (a version is
    never split: its chunks are embedded together)."""
    counts: dict[str, int] = {}
    for chunk in chunks:
        counts[chunk.version_key] = counts.get(chunk.version_key, 0) + 1
    slices: list[PlannedSlice] = []
    keys: list[str] = []
    total = 0
    for key, n in counts.items():
        if keys and total + n > max_chunks:
            slices.append(PlannedSlice(tuple(keys), total))
            keys, total = [], 0
        keys.append(key)
        total += n
    if keys:
        slices.append(PlannedSlice(tuple(keys), total))
    return slices


def writer_token() -> str:
    """The claim token of this process's writer: one for all its claims, so that a batch
    it embeds for any tenant keeps every claim it holds across turns alive."""
    return _writer_token(os.getpid())


@functools.cache
def _writer_token(pid: int) -> str:
    return claim_token("writer")


def forced_dtype(numerics: Numerics) -> str | None:
    """The dtype `GATEWAY_EMBEDDING_PRECISION` forces (`float32`, `bfloat16`), or None for
    `auto` (`precision.choose` gives a forced setting's reason as `set: ...`)."""
    return numerics.dtype if numerics.reason.startswith("set:") else None


def dtype_of(label: str) -> str:
    """The dtype of a numerics label (`bfloat16`, `cuda:float32` -> `float32`)."""
    return label.rpartition(":")[2]


class Heartbeat:
    """An EmbedWatcher that keeps a claim alive while its slice is embedded, then passes
    each batch on."""

    def __init__(self, slices: EmbedSlices, token: str, inner: EmbedWatcher | None) -> None:
        self._slices, self._token, self._inner = slices, token, inner
        self._at = time.monotonic()

    def planned(self, chunks: Sequence[Chunk]) -> None:
        if self._inner is not None:
            self._inner.planned(chunks)

    def embedded(self, chunks: Sequence[Chunk]) -> None:
        if time.monotonic() - self._at >= HEARTBEAT_EVERY_S:
            self._at = time.monotonic()
            self._slices.heartbeat(self._token)
        if self._inner is not None:
            self._inner.embedded(chunks)


@dataclass
class Adopted:
    """Vectors taken from embedders: chunk index -> (vector, packed sentence vectors)."""

    rows: dict[int, tuple[np.ndarray, bytes]] = field(default_factory=dict)
    numerics: set[str] = field(default_factory=set)


class WriterHandover:
    """For one claim: which of its pending chunks to embed next, and the vectors
    embedders handed over for the others."""

    def __init__(
        self,
        slices: EmbedSlices,
        job_ids: Sequence[str],
        embedder: Embedder,
        options: ChunkingOptions,
        timeout_s: float,
    ) -> None:
        self._slices, self._jobs, self._embedder = slices, list(job_ids), embedder
        self._chunking = chunking_of(options)
        self._timeout_s = timeout_s
        # A writer forced to a dtype takes vectors of that dtype only: the operator asked
        # for those numerics (float32: full precision), whatever embedders run on.
        self._dtype = forced_dtype(embedder.numerics)
        self._seen: set[int] = set()  # handed-over slices read already
        self.direct: set[str] = set()  # version keys the writer embeds without a claim
        self._token = writer_token()
        self._held: dict[int, set[str]] = {}  # slices claimed, not yet embedded: their keys

    def plan(
        self,
        seqs: Mapping[str, int],
        tenant: str,
        chunks_by_job: Mapping[str, list[Chunk]],
        max_chunks: int,
    ) -> None:
        """Plan the slices of the claim's jobs that no embedder planned yet; those a
        writer embedded or claimed before (and holds no longer) are open again. (Rows of
        ended jobs are swept when the writer starts, `IngestWorker.resume`.)"""
        self._slices.reopen_writer_held(self._jobs)
        planned = self._slices.planned(self._jobs)
        for job_id in self._jobs:
            if job_id not in planned:
                slices = plan_slices(chunks_by_job.get(job_id, []), max_chunks)
                self._slices.plan(job_id, seqs[job_id], tenant, self._chunking, slices)

    def adopt(self, chunks: Sequence[Chunk], pending: Mapping[str, list[int]]) -> Adopted:
        """Vectors of pending chunks from slices embedders handed over since last asked."""
        adopted = Adopted()
        other_numerics, other_slices = 0, 0
        fresh = [
            s.slice_id
            for s in self._slices.state(self._jobs)
            if s.handed and s.slice_id not in self._seen and pending.keys() & set(s.keys)
        ]
        for row in self._slices.handed(fresh):
            self._seen.add(row.id or 0)
            keys = [k for k in row.keys if k in pending]
            if (row.model_name, row.dim) != (self._embedder.name, self._embedder.dim):
                log.error(
                    "refusing the vectors of slice %s: model %s (dim %s), the index's is %s "
                    "(dim %d); embedding them here",
                    row.id,
                    row.model_name,
                    row.dim,
                    self._embedder.name,
                    self._embedder.dim,
                )
                self.direct.update(keys)
                continue
            if row.chunking != self._chunking:  # the policy changed: chunks differ
                self.direct.update(keys)
                continue
            if self._dtype is not None and dtype_of(row.numerics or "float32") != self._dtype:
                self.direct.update(keys)
                other_numerics += sum(len(pending[k]) for k in keys)
                other_slices += 1
                continue
            dim = self._embedder.dim
            ids: list[str] = json.loads(row.chunk_ids_json or "[]")
            vectors = np.frombuffer(row.vectors or b"", dtype=np.float32).reshape(-1, dim)
            sizes: list[int] = json.loads(row.sentence_sizes_json or "[]")
            starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
            blob, digests = row.sentence_vectors or b"", row.digests or b""
            where = {chunk_id: n for n, chunk_id in enumerate(ids)}
            for key in keys:
                for i in pending[key]:
                    n = where.get(chunks[i].scoped_id)
                    given = (
                        digests[n * DIGEST_BYTES : (n + 1) * DIGEST_BYTES] if n is not None else b""
                    )
                    if n is None or given != digest(chunks[i]):
                        self.direct.add(key)  # made from another text: embedded here
                        continue
                    adopted.rows[i] = (vectors[n], blob[starts[n] : starts[n + 1]])
                    adopted.numerics.add(row.numerics or "float32")
        if other_slices:
            log.info(
                "%d chunks of %d slices were handed over in other numerics than the forced "
                "%s; embedding them here",
                other_numerics,
                other_slices,
                self._dtype,
            )
        return adopted

    def next_keys(self, pending: Mapping[str, list[int]], max_chunks: int) -> set[str]:
        """The version keys to embed from (the caller embeds `max_chunks` of their chunks a
        turn): the slices the writer holds until each is embedded whole, else refused or
        stale ones, else the slices the writer claims now, else versions no slice covers;
        an empty set when every pending slice is in an embedder's hands (the writer waits
        a moment)."""
        # Every claim this writer holds, of any tenant, is renewed each turn: one that
        # spans turns stays the writer's while other tenants have theirs.
        self._slices.heartbeat(self._token)
        if self._held:  # those taken over meanwhile are an embedder's now
            still = self._slices.held(self._token, list(self._held))
            self._held = {i: keys for i, keys in self._held.items() if i in still}
            held = {k for keys in self._held.values() for k in keys} & pending.keys()
            if held:
                return held
        direct = [k for k in pending if k in self.direct]
        if direct:
            return set(direct)
        rows = self._slices.claim(self._token, self._timeout_s, max_chunks, jobs=self._jobs)
        self._held |= {r.id or 0: set(r.keys) for r in rows}
        for row in rows:
            if row.embedder_claims >= MAX_EMBEDDER_CLAIMS:
                log.warning(
                    "slice %s of job %s: %d embedder claims ended without a handover (an "
                    "embedder killed while embedding it?); no embedder takes it again, the "
                    "writer embeds it",
                    row.id,
                    row.job_id,
                    row.embedder_claims,
                )
        if rows:
            return {k for r in rows for k in r.keys} & pending.keys()
        covered = {k for s in self._slices.state(self._jobs) for k in s.keys}
        loose = {k for k in pending if k not in covered}
        if loose:
            return loose
        time.sleep(WAIT_S)
        return set()

    def watcher(self, inner: EmbedWatcher | None) -> EmbedWatcher:
        """Renews every claim this writer holds while it embeds (for any key)."""
        return Heartbeat(self._slices, self._token, inner)

    def embedded(self, chunks: int, seconds: float, pending: Mapping[str, list[int]]) -> None:
        """A turn's chunks are embedded: each slice held whose chunks are all embedded now
        is marked so (its vectors stay in the writer's memory); the others stay held."""
        done = [i for i, keys in self._held.items() if not keys & pending.keys()]
        lost = 0
        for slice_id in done:  # a claim taken over meanwhile: its vectors are ours anyway
            lost += not self._slices.hand_over(slice_id, self._token, None)
            del self._held[slice_id]
        if chunks or done:
            log.info(
                "writer embedded %d chunks in %.2f s (%d slices done, %d taken over meanwhile)",
                chunks,
                seconds,
                len(done),
                lost,
            )


def by_job(chunks: Iterable[Chunk], owner: Mapping[str, str]) -> dict[str, list[Chunk]]:
    """The chunks each job's copy contributes (by the version key's owning job)."""
    out: dict[str, list[Chunk]] = {}
    for chunk in chunks:
        out.setdefault(owner[chunk.version_key], []).append(chunk)
    return out
