"""`gateway worker --embed-only`: a process that embeds slices of queued ingest jobs and
hands their vectors to the committing writer through the catalog (`gateway/storage/
slices.py`); it never writes a generation.

Any number run, on any host that reaches the catalog: each plans the jobs nobody has
planned yet, claims a few slices of one tenant (tenants take turns, as at the writer),
embeds them with a heartbeat on its claim, and hands them over. A slice's documents are
read from the job's records as they are now and chunked with the options the slice's
plan recorded (the committing writer's policy, when it planned it); the writer checks
each vector's chunk ID and text digest before it takes it (`gateway/ingest/handover.py`).
A slice that fails here is given up at once to the writer (no embedder takes it again),
and the rest of the claim goes back to the others.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from gateway.domain import Document
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.ingest.chunk import ChunkingOptions, chunk_document
from gateway.ingest.encoding import embed_chunks
from gateway.ingest.handover import Heartbeat, chunking_of, digest, plan_slices
from gateway.ingest.parse import DocumentsRefused
from gateway.ingest.pipeline import unchanged_of
from gateway.ingest.records import document_of
from gateway.policy.model import Policy
from gateway.storage.catalog import Catalog
from gateway.storage.layout import check_model
from gateway.storage.slices import Handover, SliceRow, claim_token

log = logging.getLogger("gateway.embedder")
IDLE_POLL_S = 0.2
UNAVAILABLE_WAIT_S = 1.0
PLAN_JOBS = 4  # jobs planned per round, oldest first


def documents_of(records: Mapping[str, Sequence[Mapping[str, Any]]], tenant: str) -> list[Document]:
    """The documents of a job's records (those no longer valid are left to the writer,
    which fails the job with the reason)."""
    out = []
    for job_id, job_records in records.items():
        for n, record in enumerate(job_records):
            try:
                out.append(document_of(record, tenant, f"job {job_id} #{n}"))
            except DocumentsRefused:
                continue
    return out


class EmbedOnly:
    """The loop of one embedding process."""

    def __init__(
        self,
        catalog: Catalog,
        embedder: Embedder,
        policy: Callable[[], Policy],
        claim_timeout_s: float,
    ) -> None:
        self.catalog, self.embedder, self.policy = catalog, embedder, policy
        self.claim_timeout_s = claim_timeout_s
        self._turns: dict[str, int] = {}
        self._turn = 0

    def check_model(self) -> None:
        """Invariant 12: an embedder of another model than the index's refuses to start."""
        current = self.catalog.current_generation()
        if current is not None:
            check_model(current, self.embedder.name, self.embedder.dim)

    def run_once(self) -> int:
        """Plan new jobs, then claim and embed one tenant's next slices; the chunks
        embedded (0: nothing to do)."""
        policy = self.policy()
        self.plan_new(policy)
        waiting = self.catalog.slices.tenants_open(self.claim_timeout_s)
        if not waiting:
            return 0
        tenant = min(waiting, key=lambda t: (self._turns.get(t, 0), waiting[t]))
        self._turn += 1
        self._turns = {t: n for t, n in self._turns.items() if t in waiting}
        self._turns[tenant] = self._turn
        token = claim_token("embedder")
        rows = self.catalog.slices.claim(
            token, self.claim_timeout_s, policy.ingest.slice_chunks, tenant=tenant, embedder=True
        )
        embedded = 0
        for row in rows:
            try:
                embedded += self.embed(row, token)
            except GatewayError as exc:
                if not exc.transient:
                    self._give_up(row, token, exc)
                    continue
                self._release(token)  # the catalog is away: not the slice's fault
                raise
            except Exception as exc:  # noqa: BLE001 - one slice's fault must not stop the process
                self._give_up(row, token, exc)
        return embedded

    def _give_up(self, row: SliceRow, token: str, exc: Exception) -> None:
        """A slice that failed here goes to the writer at once, which embeds it (and fails
        its job if it must): retried by embedders, a fault of embedders only (an older
        embedder that cannot read a newer planner's chunking options) would cost a claim
        timeout each time, forever."""
        # The type only: a library's message may quote a document.
        log.error(
            "slice %s of job %s failed here (%s); left to the writer",
            row.id,
            row.job_id,
            type(exc).__name__,
        )
        try:
            self.catalog.slices.give_up(row.id or 0, token)
        except GatewayError as away:  # the claim expires instead
            log.warning("slice %s not given up (%s)", row.id, away.code)

    def _release(self, token: str) -> None:
        try:
            self.catalog.slices.release(token)
        except GatewayError as away:  # the claims expire instead
            log.warning("claims not released (%s)", away.code)

    def plan_new(self, policy: Policy) -> None:
        """Slices for the oldest jobs nobody planned yet, with this policy's chunking."""
        for job_id, seq, tenant in self.catalog.slices.unplanned_jobs(PLAN_JOBS):
            documents = documents_of(self.catalog.jobs.records_of([job_id]), tenant)
            skip = unchanged_of(self.catalog, documents)
            latest = {d.key: d for d in documents if d.key not in skip}  # a later copy wins
            chunks = [
                c
                for d in latest.values()
                for c in chunk_document(d, self.embedder.count_tokens, policy.chunking)
            ]
            slices = plan_slices(chunks, policy.ingest.slice_chunks)
            self.catalog.slices.plan(job_id, seq, tenant, chunking_of(policy.chunking), slices)

    def embed(self, row: SliceRow, token: str) -> int:
        """Embed one claimed slice and hand it over; the chunks embedded."""
        started = time.perf_counter()
        records = self.catalog.jobs.records_of([row.job_id])
        keys = set(row.keys)
        documents = {d.key: d for d in documents_of(records, row.tenant) if d.key in keys}
        options = ChunkingOptions(**json.loads(row.chunking))
        chunks = [
            c
            for d in documents.values()
            for c in chunk_document(d, self.embedder.count_tokens, options)
        ]
        dim = self.embedder.dim
        vectors = np.zeros((0, dim), dtype=np.float32)
        sentences: dict[str, bytes] = {}
        if chunks:
            watcher = Heartbeat(self.catalog.slices, token, None)
            vectors, sentences = embed_chunks(self.embedder, chunks, False, watcher)
        packed = [sentences[c.scoped_id] for c in chunks]
        handed = Handover(
            model_name=self.embedder.name,
            dim=dim,
            numerics=self.embedder.numerics.label,
            chunk_ids=[c.scoped_id for c in chunks],
            digests=b"".join(digest(c) for c in chunks),
            vectors=np.ascontiguousarray(vectors, dtype=np.float32).tobytes(),
            sentence_sizes=[len(p) for p in packed],
            sentence_vectors=b"".join(packed),
        )
        if not self.catalog.slices.hand_over(row.id or 0, token, handed):
            log.warning("slice %s was taken over before it was handed over", row.id)
            return 0
        log.info(
            "embedded slice %s of job %s: %d chunks in %.2f s",
            row.id,
            row.job_id,
            len(chunks),
            time.perf_counter() - started,
        )
        return len(chunks)

    def run(self, should_stop: Callable[[], bool]) -> None:
        """Until `should_stop()`, asked between rounds (a round's slices are handed over
        first); a catalog that cannot be reached is waited for."""
        while not should_stop():
            try:
                embedded = self.run_once()
            except GatewayError as exc:
                if not exc.transient:
                    raise
                log.warning("%s (%s); retrying", exc.code, exc.detail)
                time.sleep(UNAVAILABLE_WAIT_S)
                continue
            except Exception as exc:  # noqa: BLE001 - one round's fault must not stop the process
                # Planning or claiming (a slice's own fault is `_give_up`'s). The type only:
                # a library's message may quote a document.
                log.error("a round failed here (%s); going on", type(exc).__name__)
                time.sleep(UNAVAILABLE_WAIT_S)
                continue
            if not embedded:
                time.sleep(IDLE_POLL_S)
