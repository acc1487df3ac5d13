"""A claim of ingest jobs written as one generation, embedded a slice at a time.

The writer (`gateway/ingest/worker.py`) takes turns between tenants after each slice of
`ingest.slice_chunks` chunks, so one tenant's small job waits for at most one slice of
another tenant's backlog, however long that backlog is. The slices' vectors are kept until
the claim's last slice, and the claim is then committed as one generation: a job is never
served half written, and a writer that stops meanwhile leaves its jobs to be resumed whole.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from gateway.domain import Chunk, Document
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.ingest.handover import WriterHandover, by_job
from gateway.ingest.parse import DocumentsRefused
from gateway.ingest.pipeline import plan_ingest, unchanged_of
from gateway.ingest.records import document_of
from gateway.ingest.sliced import SlicedEncoding
from gateway.ingest.writer import Plan, write_generation
from gateway.policy.model import Policy
from gateway.storage.catalog import Catalog
from gateway.storage.jobs import Claims, JobQueue, JobResult, JobRow, job_error
from gateway.storage.layout import DataLayout

if TYPE_CHECKING:
    from sqlalchemy import Connection

log = logging.getLogger("gateway.worker")
SAVE_EVERY_S = 2.0  # how often a running job's progress is saved


class ClaimWrite:
    """One claim's jobs (of one tenant) written as one generation. Their documents are
    embedded before the writer lock is taken, a slice at a time (`step`: the writer may
    turn to other tenants between slices), then read again under it (`plan`), so each
    version is written as it is when the generation commits (an ACL changed meanwhile is
    the one written; a version deleted meanwhile is not). The jobs succeed in the commit's
    transaction (`finish`): all of the claim, or nothing of it."""

    def __init__(
        self, catalog: Catalog, claimed: Sequence[JobRow], handover_timeout_s: float | None = None
    ) -> None:
        self._catalog = catalog
        # With a timeout, slices are planned and claimed in the catalog, and those that
        # embedders handed over are taken (`gateway/ingest/handover.py`).
        self._handover_timeout_s = handover_timeout_s
        self._claimed = list(claimed)
        self._ids = [j.job_id for j in claimed]
        self._tenants = {j.job_id: j.tenant for j in claimed}
        self._first = min(j.seq or 0 for j in claimed)
        self._encoding: SlicedEncoding | None = None  # made by the first `step`
        # Decided by `plan`, under the lock, and read by `finish` in the same write.
        self._owners: dict[str, str] = {}  # version key -> the job whose copy is written
        self._plan = Plan()
        self._refused: dict[str, list[str]] = {}  # job -> documents it may not write
        self._encoded_from: dict[str, str] = {}  # version key -> the job whose copy is embedded
        self._stale = False  # the copies to write are not those embedded: embed again

    @property
    def jobs(self) -> list[JobRow]:
        return list(self._claimed)

    @property
    def first(self) -> int:
        """Arrival of the claim's oldest job (the writer's turns break ties by it)."""
        return self._first

    def run(self, layout: DataLayout, embedder: Embedder, policy: Policy) -> None:
        """Embed, write, and mark the jobs succeeded (in the commit, or at once if every
        version was stored as sent already)."""
        while not self.step(layout, embedder, policy):
            pass

    def step(self, layout: DataLayout, embedder: Embedder, policy: Policy) -> bool:
        """Embed the next slice of `ingest.slice_chunks` chunks; once every chunk is
        embedded, write the generation. Whether the claim is done."""
        if self._encoding is None:
            self._encoding = self.encode_ahead(embedder, policy)
        self._encoding.embed_next(policy.ingest.slice_chunks)
        if not self._encoding.done:
            return False
        self._stale = False
        written = write_generation(
            layout,
            self.plan,
            embedder=embedder,
            options=policy.chunking,
            ann_min_rows=policy.retrieval.ann_min_rows,
            encoded=self._encoding.result(),
            within=self.finish,
        )
        if self._stale:  # rare: whose copy wins changed under the lock; embed those again
            self._encoding = None
            return False
        if written.report is None:  # everything was stored as sent already
            results = self.results({})
            current = self._catalog.current_generation_id()
            self._catalog.jobs.finish_unchanged(results, current, self.claims)
            if self._refused:
                self._catalog.jobs.fail(list(self._refused), self._refusals(), None, self.claims)
        return True

    def encode_ahead(self, embedder: Embedder, policy: Policy) -> SlicedEncoding:
        """The versions not stored as sent already, chunked, to be embedded a slice at a
        time; each job's progress is saved as it goes."""
        ahead = self._latest(self._catalog)
        skip = unchanged_of(self._catalog, [doc for _, doc in ahead.values()])
        self._encoded_from = {key: job for key, (job, _) in ahead.items() if key not in skip}
        handover = None
        if self._handover_timeout_s is not None:
            handover = WriterHandover(
                self._catalog.slices, self._ids, embedder, policy.chunking, self._handover_timeout_s
            )
        encoding = SlicedEncoding(
            [d for key, (_, d) in ahead.items() if key not in skip],
            embedder,
            policy.chunking,
            watcher=JobProgress(self._catalog.jobs, ahead, skip),
            handover=handover,
        )
        if handover is not None:
            seqs = {j.job_id: j.seq or 0 for j in self._claimed}
            mine = by_job(encoding.chunks, self._encoded_from)
            handover.plan(seqs, self._claimed[0].tenant, mine, policy.ingest.slice_chunks)
        return encoding

    def plan(self, catalog: Catalog) -> Plan:
        """The generation's change, from the jobs' records as they are under the lock."""
        latest = self._latest(catalog)
        self._owners = {key: job_id for key, (job_id, _) in latest.items()}
        embedded = self._encoded_from
        if any(embedded.get(key, job) != job for key, job in self._owners.items()):
            self._stale, self._plan = True, Plan()  # writes nothing; `step` embeds again
            return self._plan
        self._plan = plan_ingest(catalog, [doc for _, doc in latest.values()])
        return self._plan

    def finish(self, connection: Connection, generation: int, chunks: Mapping[str, int]) -> None:
        self._catalog.jobs.finish(connection, self.results(chunks), generation, self.claims)
        if self._refused:  # failed in the same commit: nothing of them is written
            refusals = self._refusals()
            self._catalog.jobs.fail(list(self._refused), refusals, connection, self.claims)
        # Who pushed each version written: what an ingest key may change later (owners.py).
        by = {j.job_id: j.submitted_by for j in self._claimed}
        added = {d.key for d in self._plan.changes.add}
        pushers = {key: by[job] for key, job in self._owners.items() if key in added}
        self._catalog.owners.record(connection, pushers)

    @property
    def claims(self) -> Claims:
        """The claim of each job, as this writer took it (`JobQueue.claim`)."""
        return {j.job_id: j.started_at for j in self._claimed}

    def results(self, chunks: Mapping[str, int]) -> list[JobResult]:
        """Each job's chunks written and versions left as stored, by the copies it owns."""
        unchanged = set(self._plan.unchanged)
        results = []
        for job_id in (j for j in self._ids if j not in self._refused):
            mine = [key for key, owner in self._owners.items() if owner == job_id]
            results.append(
                JobResult(
                    job_id,
                    chunks=sum(chunks.get(key, 0) for key in mine),
                    unchanged=sum(key in unchanged for key in mine),
                )
            )
        return results

    def _latest(self, catalog: Catalog) -> dict[str, tuple[str, Document]]:
        """Each version of the claimed jobs' records once, as the catalog holds them now,
        leaving out the jobs an ingest key may not write (`_refused`)."""
        documents = _documents(catalog.jobs.records_of(self._ids), self._tenants)
        self._refused = _refused(catalog, self._claimed, documents)
        return _latest([(job, doc) for job, doc in documents if job not in self._refused])

    def _refusals(self) -> list[dict[str, object]]:
        return [
            job_error(
                f"not_owner: documents {ids[:20]} have versions this key did not push (an "
                "admin's, `gateway ingest`'s or another key's, written or queued before this "
                "job); nothing of this job was applied"
            )
            for ids in self._refused.values()
        ]


class JobProgress:
    """Each claimed job's documents and chunks embedded so far, saved to its row at most
    every SAVE_EVERY_S (for `GET /admin/jobs/{id}`); a document is done when its last
    chunk is, and one stored exactly as sent before is done at once."""

    def __init__(
        self, jobs: JobQueue, ahead: Mapping[str, tuple[str, Document]], unchanged: set[str]
    ) -> None:
        self._jobs = jobs
        self._owner = {key: job_id for key, (job_id, _) in ahead.items()}
        self._documents: Counter[str] = Counter(self._owner[k] for k in unchanged if k in ahead)
        self._chunks: Counter[str] = Counter()
        self._planned: Counter[str] = Counter({job_id: 0 for job_id in self._owner.values()})
        self._left: Counter[str] = Counter()  # version key -> chunks still to embed
        self._unchanged = unchanged
        self._saved_at = 0.0

    def planned(self, chunks: Sequence[Chunk]) -> None:
        for chunk in chunks:
            key = chunk.version_key
            self._left[key] += 1
            self._planned[self._owner[key]] += 1
        for key, job_id in self._owner.items():  # nothing to embed: done already
            if key not in self._left and key not in self._unchanged:
                self._documents[job_id] += 1
        self._save()

    def embedded(self, chunks: Sequence[Chunk]) -> None:
        for chunk in chunks:
            key = chunk.version_key
            job_id = self._owner[key]
            self._chunks[job_id] += 1
            self._left[key] -= 1
            if self._left[key] == 0:
                self._documents[job_id] += 1
        if time.monotonic() - self._saved_at >= SAVE_EVERY_S or not +self._left:
            self._save()

    def _save(self) -> None:
        self._saved_at = time.monotonic()
        done = {
            job_id: (self._documents[job_id], self._chunks[job_id], planned)
            for job_id, planned in self._planned.items()
        }
        try:
            self._jobs.progress(done)
        except GatewayError as exc:  # progress is for people watching: never fail a job
            log.warning("job progress not saved (%s)", exc.code)


def _documents(
    records: Mapping[str, Sequence[Mapping[str, object]]], tenants: Mapping[str, str]
) -> list[tuple[str, Document]]:
    """(job_id, document) of each record, in order; records were valid when queued."""
    out = []
    for job_id, job_records in records.items():
        for n, record in enumerate(job_records):
            try:
                out.append((job_id, document_of(record, tenants[job_id], f"job {job_id} #{n}")))
            except DocumentsRefused as refused:  # only if the rules tightened since
                first = refused.problems[0]
                raise GatewayError(
                    "invalid_document", f"document {n}: {first.field}: {first.message}"
                ) from None
    return out


def _refused(
    catalog: Catalog, jobs: Sequence[JobRow], documents: Sequence[tuple[str, Document]]
) -> dict[str, list[str]]:
    """The jobs of ingest keys that carry a document with a version another subject pushed
    (`Owners.refused`): the push route checks this when it queues a job, but two keys
    pushing the same new document at once both pass that check; the writer decides again
    here, under its lock. Job -> the doc_ids it may not write."""
    carried: dict[str, set[str]] = {j.job_id: set() for j in jobs}
    for job_id, doc in documents:
        carried[job_id].add(doc.doc_id)
    keys = {j.submitted_by for j in jobs if _is_ingest_key(catalog, j.submitted_by)}
    if not keys:
        return {}
    claim = [(j.job_id, j.submitted_by, carried[j.job_id]) for j in jobs]
    return catalog.owners.refused(jobs[0].tenant, claim, keys)


def _is_ingest_key(catalog: Catalog, subject: str) -> bool:
    """Whether a job's submitter is an ingest key (an admin may push any document)."""
    if not subject.startswith("key:"):
        return False
    row = catalog.api_key(subject.removeprefix("key:"))
    return row is not None and row.scope == "ingest"


def _latest(documents: Sequence[tuple[str, Document]]) -> dict[str, tuple[str, Document]]:
    """Each version once: a later job's copy wins over an earlier one's."""
    return {doc.key: (job_id, doc) for job_id, doc in documents}
