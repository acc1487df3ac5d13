"""The writer of the push API: takes queued ingest jobs in order and writes each claim as one
generation.

When it is behind, one claim joins the oldest queued jobs (up to the policy's
`ingest.coalesce_documents` documents), so a burst of small batches costs a few
generations, not one per batch. The documents are chunked and embedded before the writer
lock is taken, so ACL changes and deletes (which take it briefly) are not held up behind
the model; under the lock the jobs' records are read again and written as they are then.
The jobs are marked succeeded in the transaction that commits their generation.

Only one writer runs per deployment (it holds the `WriterLease`); when it starts, jobs a
stopped writer left running are queued again (or failed with the reason, after repeated
interruptions).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.domain import Chunk, Document
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.ingest.encoding import Encoded, encode
from gateway.ingest.parse import DocumentsRefused
from gateway.ingest.pipeline import plan_ingest, unchanged_of
from gateway.ingest.records import document_of
from gateway.ingest.writer import Plan, write_generation
from gateway.policy.model import Policy
from gateway.storage.catalog import Catalog
from gateway.storage.jobs import JobQueue, JobResult, JobRow, job_error
from gateway.storage.layout import DataLayout

if TYPE_CHECKING:
    from sqlalchemy import Connection

log = logging.getLogger("gateway.worker")
IDLE_POLL_S = 0.2  # how soon a queued job is taken when the writer is idle
UNAVAILABLE_WAIT_S = 1.0
SAVE_EVERY_S = 2.0  # how often a running job's progress is saved
PURGE_EVERY_S = 3600.0  # how often the writer deletes audit records past their retention


@dataclass
class IngestWorker:
    layout: DataLayout
    embedder: Embedder
    policy: Callable[[], Policy]  # the policy now (it may be reloaded between claims)

    def __post_init__(self) -> None:
        self.catalog: Catalog = self.layout.open_catalog()
        self._purged_at: float | None = None

    def purge_audit(self) -> int:
        """Delete audit records older than the policy's retention (at start, then hourly:
        the one writer of a deployment does it for every replica); how many went."""
        now = time.monotonic()
        if self._purged_at is not None and now - self._purged_at < PURGE_EVERY_S:
            return 0
        self._purged_at = now
        days = self.policy().audit.retention_days
        purged = self.catalog.audit.purge(dt.datetime.now(dt.UTC) - dt.timedelta(days=days))
        if purged:
            log.info("purged %d audit records older than %d days", purged, days)
        return purged

    def resume(self) -> tuple[int, int]:
        """At start, holding the writer slot: (jobs resumed, jobs failed)."""
        resumed, failed = self.catalog.jobs.resume_interrupted()
        if resumed or failed:
            log.warning(
                "jobs interrupted by a stopped writer: %d resumed, %d failed", resumed, failed
            )
        return resumed, failed

    def run_once(self) -> int:
        """Claim and write the next jobs; how many were claimed (0: the queue is empty).
        A service that is away (the catalog, the index store) fails no job: the error
        goes up, and the jobs are queued again once it is back."""
        policy = self.policy()
        jobs = self.catalog.jobs.claim(policy.ingest.coalesce_documents)
        if not jobs:
            return 0
        try:
            self._write(jobs, policy)
        except Exception as exc:
            if _transient(exc) or len(jobs) == 1:
                self._fail(jobs[0], exc)
            else:  # one job's fault must not fail the others: each is tried alone
                log.warning(
                    "a batch of %d jobs failed (%s); writing them one by one",
                    len(jobs),
                    type(exc).__name__,
                )
                for job in jobs:
                    try:
                        self._write([job], policy)
                    except Exception as alone:
                        self._fail(job, alone)
        return len(jobs)

    def run(self, should_stop: Callable[[], bool]) -> None:
        """Until `should_stop()`, asked between claims. A catalog or index store that
        cannot be reached is waited for; then the jobs it interrupted are queued again."""
        interrupted = False
        while not should_stop():
            try:
                if interrupted:
                    self.resume()  # this writer holds the lease: nobody else runs them
                    interrupted = False
                self.purge_audit()
                claimed = self.run_once()
            except GatewayError as exc:
                if not exc.transient:
                    raise
                interrupted = True
                log.warning("%s; retrying", exc.code)
                time.sleep(UNAVAILABLE_WAIT_S)
                continue
            if not claimed:
                time.sleep(IDLE_POLL_S)

    def _fail(self, job: JobRow, exc: Exception) -> None:
        if _transient(exc):
            raise exc  # not the job's fault: it stays running until `resume` queues it
        if isinstance(exc, GatewayError):
            message = f"{exc.code}: {exc.detail}"
        else:  # the type only: a library's message may quote a document
            message = f"the writer failed ({type(exc).__name__}); nothing of this job was applied"
            log.error("job %s failed", job.job_id, exc_info=exc)
        self.catalog.jobs.fail([job.job_id], [job_error(message)])

    def _write(self, jobs: Sequence[JobRow], policy: Policy) -> None:
        ClaimWrite(self.catalog, jobs).run(self.layout, self.embedder, policy)


class ClaimWrite:
    """One claim's jobs written as one generation. Their documents are embedded before the
    writer lock is taken (`encode_ahead`), then read again under it (`plan`), so each
    version is written as it is when the generation commits (an ACL changed meanwhile is
    the one written; a version deleted meanwhile is not). The jobs succeed in the commit's
    transaction (`finish`)."""

    def __init__(self, catalog: Catalog, claimed: Sequence[JobRow]) -> None:
        self._catalog = catalog
        self._ids = [j.job_id for j in claimed]
        self._tenants = {j.job_id: j.tenant for j in claimed}
        # Decided by `plan`, under the lock, and read by `finish` in the same write.
        self._owners: dict[str, str] = {}  # version key -> the job whose copy is written
        self._plan = Plan()

    def run(self, layout: DataLayout, embedder: Embedder, policy: Policy) -> None:
        """Embed, write, and mark the jobs succeeded (in the commit, or at once if every
        version was stored as sent already)."""
        encoded = self.encode_ahead(embedder, policy)
        written = write_generation(
            layout,
            self.plan,
            embedder=embedder,
            options=policy.chunking,
            ann_min_rows=policy.retrieval.ann_min_rows,
            encoded=encoded,
            within=self.finish,
        )
        if written.report is None:  # everything was stored as sent already
            results = self.results({})
            self._catalog.jobs.finish_unchanged(results, self._catalog.current_generation_id())

    def encode_ahead(self, embedder: Embedder, policy: Policy) -> Encoded:
        """The versions not stored as sent already, chunked and embedded; each job's
        progress is saved as it goes."""
        ahead = self._latest(self._catalog.jobs)
        skip = unchanged_of(self._catalog, [doc for _, doc in ahead.values()])
        return encode(
            [d for key, (_, d) in ahead.items() if key not in skip],
            embedder,
            policy.chunking,
            watcher=JobProgress(self._catalog.jobs, ahead, skip),
        )

    def plan(self, catalog: Catalog) -> Plan:
        """The generation's change, from the jobs' records as they are under the lock."""
        latest = self._latest(catalog.jobs)
        self._owners = {key: job_id for key, (job_id, _) in latest.items()}
        self._plan = plan_ingest(catalog, [doc for _, doc in latest.values()])
        return self._plan

    def finish(self, connection: Connection, generation: int, chunks: Mapping[str, int]) -> None:
        self._catalog.jobs.finish(connection, self.results(chunks), generation)

    def results(self, chunks: Mapping[str, int]) -> list[JobResult]:
        """Each job's chunks written and versions left as stored, by the copies it owns."""
        unchanged = set(self._plan.unchanged)
        results = []
        for job_id in self._ids:
            mine = [key for key, owner in self._owners.items() if owner == job_id]
            results.append(
                JobResult(
                    job_id,
                    chunks=sum(chunks.get(key, 0) for key in mine),
                    unchanged=sum(key in unchanged for key in mine),
                )
            )
        return results

    def _latest(self, jobs: JobQueue) -> dict[str, tuple[str, Document]]:
        """Each version of the claimed jobs' records once, as `jobs` holds them now."""
        return _latest(_documents(jobs.records_of(self._ids), self._tenants))


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


def _transient(exc: Exception) -> bool:
    """A service away for a moment (`GatewayError.transient`), not a fault of the job."""
    return isinstance(exc, GatewayError) and exc.transient


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


def _latest(documents: Sequence[tuple[str, Document]]) -> dict[str, tuple[str, Document]]:
    """Each version once: a later job's copy wins over an earlier one's."""
    return {doc.key: (job_id, doc) for job_id, doc in documents}


def exit_with(parent_pid: int | None) -> Callable[[], bool]:
    """A stop test for a writer started by `gateway serve`: stop once that process is gone
    (a writer is never left running, and holding the slot, after its server was killed)."""
    return lambda: parent_pid is not None and os.getppid() != parent_pid
