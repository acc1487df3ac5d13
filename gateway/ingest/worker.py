"""The writer of the push API: takes queued ingest jobs tenant by tenant and writes each
claim as one generation.

Tenants take turns: each turn embeds one slice (`ingest.slice_chunks` chunks) of the
tenant's claim, or writes it once the last slice is embedded, then the turn goes to the
tenant served longest ago. So one tenant's one-document job waits for at most one slice of
another tenant's backlog, however long that backlog is (`gateway/ingest/claims.py`).
When a tenant is behind, one claim joins its oldest queued jobs (up to the policy's
`ingest.coalesce_documents` documents; never another tenant's), so a burst of small
batches costs a few generations, not one per batch. The documents are chunked and embedded
before the writer lock is taken, so ACL changes and deletes (which take it briefly) are not
held up behind the model; under the lock the jobs' records are read again and written as
they are then. The jobs are marked succeeded in the transaction that commits their
generation.

Only one writer runs per deployment (it holds the `WriterLease`); when it starts, jobs a
stopped writer left running are queued again (or failed with the reason, after repeated
interruptions); a writer stopping in order hands the claims it holds back untouched.

A service away (the catalog, the index store: a transient error) fails no job: its jobs are
queued again, their attempt given back. A job whose own write raises a transient error
while both services answer (e.g. a doc_id too long for PostgreSQL's index, which the
database reports as an error of its own) is tried MAX_TRANSIENT_TRIES times in a row, then
failed with the reason: before, it was given back and tried again without end. "In a row":
a failure that an outage explains (a service did not answer just after it) starts the count
again, so blips at the edges of separate outages never add up to fail a job.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.ingest.claims import ClaimWrite
from gateway.ingest.erasure import ErasureReport, erase
from gateway.ingest.tenants import delete_superseded
from gateway.policy.model import Policy
from gateway.storage.catalog import Catalog
from gateway.storage.jobs import JobRow, job_error
from gateway.storage.layout import DataLayout, remove_erased_copies

log = logging.getLogger("gateway.worker")
IDLE_POLL_S = 0.2  # how soon a queued job is taken when the writer is idle
UNAVAILABLE_WAIT_S = 1.0
PURGE_EVERY_S = 3600.0  # how often the writer deletes audit records past their retention
ERASE_CHECK_S = 1.0  # how often the writer looks for erasures due
ERASE_RETRY_S = 60.0  # after an erasure failed
# Tries of a job whose write raised a transient error while the catalog and the index store
# answered just after: more is no flicker of theirs but the job's own, which would loop.
MAX_TRANSIENT_TRIES = 10


@dataclass
class IngestWorker:
    layout: DataLayout
    embedder: Embedder
    policy: Callable[[], Policy]  # the policy now (it may be reloaded between claims)
    # How long an embedder's claim on a slice lasts without a heartbeat; None: the writer
    # embeds everything itself, without the handover table (`gateway/ingest/handover.py`).
    claim_timeout_s: float | None = None
    # Claims being embedded, by tenant (one each), and when each tenant last had a turn.
    _claims: dict[str, ClaimWrite] = field(default_factory=dict, init=False)
    _turns: dict[str, int] = field(default_factory=dict, init=False)
    # job_id -> its tries that failed transiently while the services answered, in a row
    # (reset by its success, or by a failure that an outage explains)
    _transient_tries: dict[str, int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.catalog: Catalog = self.layout.open_catalog()
        self._purged_at: float | None = None
        self._erase_checked = 0.0
        self._erased_through = 0  # this data dir holds no generation older than this
        self._retained_at: float | None = None
        self._turn = 0

    def erase_due(self) -> ErasureReport | None:
        """Erase what deletes asked for once due (docs/security.md, "Erasure"), and delete
        superseded versions past the policy's retention (hourly); never waits for a
        replica: a retire that must wait is tried again at the next look."""
        now = time.monotonic()
        if now - self._erase_checked < ERASE_CHECK_S:
            return None
        self._erase_checked = now
        self._erase_own_copies()
        retention = self.policy().retention
        if retention.superseded_days is not None and (
            self._retained_at is None or now - self._retained_at >= PURGE_EVERY_S
        ):
            self._retained_at = now
            expired = delete_superseded(self.layout, retention.superseded_days)
            if expired:
                log.info("deleted %d superseded versions past their retention", expired)
        if not self.catalog.erasures.due(retention.erase_within_s):
            return None
        try:
            return erase(self.layout, ann_min_rows=self.policy().retrieval.ann_min_rows)
        except GatewayError:
            raise  # a service away: the run loop waits for it
        except Exception:  # an erasure's fault must not stop ingest: tried again later
            log.exception("the erasure failed; trying again in %.0f s", ERASE_RETRY_S)
            self._erase_checked = now + ERASE_RETRY_S
            return None

    def _erase_own_copies(self) -> None:
        """This writer's data dir keeps no generation an erasure retired: with an object
        store it is this host's own, which `gateway erase` run elsewhere (or a writer
        before this one) never touched."""
        current = self.catalog.current_generation_id()
        if current is None:
            return
        try:
            self._erased_through = remove_erased_copies(
                self.layout, self.catalog, current, self._erased_through
            )
        except GatewayError:
            raise  # a service away: the run loop waits for it
        except Exception:  # must not stop ingest: the next look tries again
            log.exception("removing this data dir's erased copies failed; retrying")

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

    def resume(self, outage: bool = False) -> tuple[int, int]:
        """At start, holding the writer slot: (jobs resumed, jobs failed). Claims this
        writer was embedding are dropped: their jobs are among those queued again; slices
        an earlier writer claimed are open again at once (the lease says it is gone), and
        handover rows of ended jobs are deleted.
        After an `outage` (this writer ran on): every job is queued again, none failed."""
        self._claims.clear()
        self.catalog.slices.release_writers_claims()
        # Handover rows of ended jobs (an earlier release left some): once here, not at
        # every claim, for every job ends with its rows now (`slices.forget`).
        self.catalog.slices.sweep()
        resumed, failed = self.catalog.jobs.resume_interrupted(outage)
        if resumed or failed:
            why = "an outage" if outage else "a stopped writer"
            log.warning("jobs interrupted by %s: %d resumed, %d failed", why, resumed, failed)
        return resumed, failed

    def run_once(self) -> int:
        """One turn: the next tenant's claim (claimed now, or carried on) embeds a slice,
        and is written once embedded; how many jobs the turn worked for (0: the queue is
        empty). A service that is away (the catalog, the index store) fails no job: the
        error goes up, and the jobs are queued again once it is back."""
        policy = self.policy()
        tenant = self._next_tenant()
        if tenant is None:
            return 0
        claim = self._claims.pop(tenant, None)
        if claim is None:
            claimed = self.catalog.jobs.claim(policy.ingest.coalesce_documents, tenant=tenant)
            if not claimed:
                return 0
            claim = ClaimWrite(self.catalog, claimed, self.claim_timeout_s)
        jobs = claim.jobs
        try:
            if not claim.step(self.layout, self.embedder, policy):
                self._claims[tenant] = claim  # more slices to embed, after others' turns
            else:
                for job in jobs:
                    self._transient_tries.pop(job.job_id, None)
        except Exception as exc:
            if _transient(exc) and not self._services_answer():
                self._outage_explains(jobs)
                raise exc  # an outage: the run loop waits for it, then queues the jobs again
            if len(jobs) == 1:
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
                        self._transient_tries.pop(job.job_id, None)
                    except Exception as alone:
                        self._fail(job, alone)
        return len(jobs)

    def _next_tenant(self) -> str | None:
        """The tenant whose turn it is: of those with a claim being embedded or jobs
        queued, the one served longest ago (never served first; then the oldest job)."""
        waiting = self.catalog.jobs.waiting()
        for tenant, claim in self._claims.items():
            waiting[tenant] = min(waiting.get(tenant, claim.first), claim.first)
        if not waiting:
            self._turns.clear()
            return None
        tenant = min(waiting, key=lambda t: (self._turns.get(t, 0), waiting[t]))
        self._turn += 1
        # Tenants with nothing waiting are forgotten: when they come back they go first.
        self._turns = {t: n for t, n in self._turns.items() if t in waiting}
        self._turns[tenant] = self._turn
        return tenant

    def release(self) -> None:
        """Hand the claims being embedded back to the queue, untouched (a writer stopping
        in order: their jobs were not interrupted by a fault)."""
        claims, self._claims = self._claims, {}
        jobs = [job.job_id for claim in claims.values() for job in claim.jobs]
        if jobs:
            self.catalog.jobs.release(jobs)

    def run(
        self, should_stop: Callable[[], bool], may_hand_back: Callable[[], bool] = lambda: True
    ) -> None:
        """Until `should_stop()`, asked between turns. A catalog or index store that
        cannot be reached is waited for; then the jobs it interrupted are queued again.
        Claims not yet written when it stops are handed back to the queue if
        `may_hand_back()` (the lease is still held: once another writer may have resumed
        them, they are its jobs)."""
        interrupted = False
        while not should_stop():
            try:
                if interrupted:
                    self.resume(outage=True)  # this writer holds the lease: they are its
                    interrupted = False
                self.purge_audit()
                self.erase_due()
                claimed = self.run_once()
            except GatewayError as exc:
                if not exc.transient:
                    raise
                interrupted = True
                log.warning("%s (%s); retrying", exc.code, exc.detail)  # a full disk, say
                time.sleep(UNAVAILABLE_WAIT_S)
                continue
            if not claimed:
                time.sleep(IDLE_POLL_S)
        try:
            if may_hand_back():
                self.release()
        except GatewayError as exc:  # the catalog is away: the next writer resumes them
            log.warning("claims not handed back (%s)", exc.code)

    def _services_answer(self) -> bool:
        """Whether the catalog and the index store answer now: a transient error of a job's
        write that they do not explain is the job's own."""
        try:
            self.catalog.current_generation_id()
        except GatewayError as exc:
            if exc.transient:
                return False
            raise
        return self.layout.store is None or self.layout.store.answers()

    def _outage_explains(self, jobs: Sequence[JobRow]) -> None:
        """A failure of these jobs came with a service away: the transient failures before
        it were the outage's too, not a run of the jobs' own."""
        for job in jobs:
            self._transient_tries.pop(job.job_id, None)

    def _fail(self, job: JobRow, exc: Exception) -> None:
        if _transient(exc):
            if not self._services_answer():
                self._outage_explains([job])
                raise exc  # not the job's fault: it stays running until `resume` queues it
            tries = self._transient_tries.get(job.job_id, 0) + 1
            self._transient_tries[job.job_id] = tries
            if tries < MAX_TRANSIENT_TRIES:
                raise exc  # maybe a moment's outage after all: queued again, tried again
            assert isinstance(exc, GatewayError)
            message = (
                f"{exc.code}: the write of this job failed {tries} times in a row while "
                "the catalog and the index store answered; nothing of this job was applied"
            )
            log.error("job %s failed: %s on each of %d tries", job.job_id, exc.code, tries)
        elif isinstance(exc, GatewayError):
            message = f"{exc.code}: {exc.detail}"
        else:  # the type only: a library's message may quote a document
            message = f"the writer failed ({type(exc).__name__}); nothing of this job was applied"
            log.error("job %s failed", job.job_id, exc_info=exc)
        self._transient_tries.pop(job.job_id, None)
        self.catalog.jobs.fail(
            [job.job_id], [job_error(message)], claimed={job.job_id: job.started_at}
        )

    def _write(self, jobs: Sequence[JobRow], policy: Policy) -> None:
        ClaimWrite(self.catalog, jobs, self.claim_timeout_s).run(self.layout, self.embedder, policy)


def _transient(exc: Exception) -> bool:
    """A service away for a moment (`GatewayError.transient`), not a fault of the job."""
    return isinstance(exc, GatewayError) and exc.transient


def exit_with(parent_pid: int | None) -> Callable[[], bool]:
    """A stop test for a writer started by `gateway serve`: stop once that process is gone
    (a writer is never left running, and holding the slot, after its server was killed)."""
    return lambda: parent_pid is not None and os.getppid() != parent_pid
