"""The durable queue of ingest jobs, in the catalog's database.

A job is one `POST /admin/documents` batch: its documents (as validated records), who sent
it, and what became of it. `queued` jobs wait in order of arrival within their tenant; the
writer claims a tenant's oldest (several at once when it is behind, never two tenants'
together), turning from tenant to tenant, and marks them `running`; the transaction that
commits their generation also marks them `succeeded`, so a job is never reported done
without its documents, nor its documents served with the job still open. A writer that
dies leaves `running` jobs behind: the next writer queues them again, and fails a job that
has been interrupted too often, with the reason.

A tenant's queued and running jobs are bounded in number and in bytes of documents (the
policy's `ingest.max_pending_jobs` and `ingest.max_pending_bytes`): beyond either, 429
`ingest_backlog` for that tenant alone.

Documents of a queued or running job are not yet in the catalog; an ACL change or a delete
that arrives after the job is applied to its records too (`patch_pending`), so a change
sent later is never undone by a batch sent earlier; in the transaction that commits the
change's generation, so a change that fails changes no queued copy either.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, update
from sqlalchemy.orm import defer
from sqlmodel import Field, Session, SQLModel, col, func, select

from gateway.errors import GatewayError
from gateway.storage.slices import forget

PENDING = ("queued", "running")
MAX_ATTEMPTS = 3  # a job that stopped its writer this often is failed, not tried forever


class JobRow(SQLModel, table=True):
    __tablename__ = "jobs"
    seq: int | None = Field(default=None, primary_key=True)  # order of arrival
    job_id: str = Field(unique=True)
    tenant: str = Field(index=True)
    submitted_by: str  # the caller's subject or key ID; never content
    kind: str = "ingest"
    status: str = Field(default="queued", index=True)
    documents: int
    chunks: int = 0
    unchanged: int = 0
    index_generation: int | None = None
    errors_json: str = "[]"
    records_json: str  # the documents as validated records, until the job ends
    attempts: int = 0
    # Progress while running: documents and chunks embedded of `chunks_planned` (known
    # once the writer has chunked the batch).
    documents_done: int = 0
    chunks_done: int = 0
    chunks_planned: int | None = None
    size_bytes: int = 0  # of `records_json` when queued: the tenant's quota counts it
    created_at: dt.datetime
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None

    @property
    def records(self) -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = json.loads(self.records_json)
        return records

    @property
    def errors(self) -> list[dict[str, Any]]:
        errors: list[dict[str, Any]] = json.loads(self.errors_json)
        return errors


@dataclass(frozen=True)
class JobResult:
    job_id: str
    chunks: int
    unchanged: int


# job_id -> the `started_at` of the claim a writer holds (`JobRow.started_at` as claimed).
Claims = Mapping[str, dt.datetime | None]


def _in_claim(job_id: str, claimed: Claims | None) -> tuple[Any, ...]:
    """The job, still running; with `claimed`, still in that claim. A writer whose lease
    dropped may still be running while the writer that took over requeued its jobs and
    claimed them again: its late finish or failure must end neither the job another writer
    ended nor the claim another writer now holds (each claim has its own `started_at`)."""
    where: tuple[Any, ...] = (col(JobRow.job_id) == job_id, col(JobRow.status) == "running")
    if claimed is not None and job_id in claimed:
        where += (col(JobRow.started_at) == claimed[job_id],)
    return where


def job_error(message: str) -> dict[str, Any]:
    """A problem of the job as a whole, in the shape of a document's problem."""
    return {"index": None, "doc_id": None, "field": None, "message": message}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class JobQueue:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._submitting = threading.Lock()

    def submit(
        self,
        tenant: str,
        submitted_by: str,
        records: Sequence[dict[str, Any]],
        max_pending: int,
        max_bytes: int | None = None,
    ) -> JobRow:
        """Queue a batch, or refuse it with 429 `ingest_backlog` when the tenant already
        has `max_pending` jobs waiting or running, or when its queued documents and this
        batch would pass `max_bytes` (a batch alone is always taken: it fits the body
        limit). Another tenant's backlog never counts. Count and insert are one step per
        tenant: in this process by a lock, across processes on PostgreSQL by an advisory
        lock on the tenant."""
        records_json = json.dumps(list(records))
        size = len(records_json.encode())
        with self._submitting, Session(self.engine, expire_on_commit=False) as s:
            if self.engine.dialect.name == "postgresql":
                key = int.from_bytes(
                    hashlib.sha256(tenant.encode()).digest()[:8], "big", signed=True
                )
                s.exec(select(func.pg_advisory_xact_lock(key)))
            pending, queued_bytes = s.exec(
                select(func.count(), func.coalesce(func.sum(JobRow.size_bytes), 0))
                .select_from(JobRow)
                .where(col(JobRow.tenant) == tenant, col(JobRow.status).in_(PENDING))
            ).one()
            if pending >= max_pending:
                wait = self._retry_after(s, tenant, pending)
                raise GatewayError(
                    "ingest_backlog",
                    f"{pending} jobs of this tenant are queued or running (the policy's "
                    f"ingest.max_pending_jobs is {max_pending}); retry in {wait} s",
                    headers={"Retry-After": str(wait)},
                )
            if max_bytes is not None and pending and queued_bytes + size > max_bytes:
                wait = self._retry_after(s, tenant, pending)
                raise GatewayError(
                    "ingest_backlog",
                    f"this tenant's queued and running jobs hold {queued_bytes} bytes of "
                    f"documents, and this batch {size} more (the policy's "
                    f"ingest.max_pending_bytes is {max_bytes}); retry in {wait} s",
                    headers={"Retry-After": str(wait)},
                )
            row = JobRow(
                job_id=str(uuid.uuid4()),
                tenant=tenant,
                submitted_by=submitted_by,
                documents=len(records),
                records_json=records_json,
                size_bytes=size,
                created_at=_now(),
            )
            s.add(row)
            s.commit()
            return row

    def _retry_after(self, s: Session, tenant: str, pending: int) -> int:
        """Seconds until a slot is likely free: the recent time per job of this tenant, at
        least 1. Only its own jobs: another tenant's durations would tell it how much that
        tenant ingests (invariant 13)."""
        recent = s.exec(
            select(JobRow.started_at, JobRow.finished_at)
            .where(col(JobRow.tenant) == tenant, col(JobRow.status) == "succeeded")
            .order_by(col(JobRow.seq).desc())
            .limit(20)
        ).all()
        spans = [(end - start).total_seconds() for start, end in recent if start and end]
        per_job = sum(spans) / len(spans) if spans else 5.0
        return max(1, min(300, math.ceil(per_job)))

    def job(self, tenant: str, job_id: str) -> JobRow | None:
        """The tenant's job; another tenant's is None, as if it did not exist."""
        with Session(self.engine) as s:
            row = s.exec(select(JobRow).where(col(JobRow.job_id) == job_id)).first()
            return row if row is not None and row.tenant == tenant else None

    def recent(self, tenant: str, limit: int) -> list[JobRow]:
        """The tenant's newest jobs, newest first, without the documents they carry."""
        query = (
            select(JobRow)
            .options(defer(JobRow.records_json))  # type: ignore[arg-type]
            .where(col(JobRow.tenant) == tenant)
            .order_by(col(JobRow.seq).desc())
            .limit(limit)
        )
        with Session(self.engine) as s:
            return list(s.exec(query))

    def waiting(self) -> dict[str, int]:
        """Tenants with queued jobs, each with the arrival (seq) of its oldest."""
        with Session(self.engine) as s:
            found = s.exec(
                select(JobRow.tenant, func.min(JobRow.seq))
                .where(col(JobRow.status) == "queued")
                .group_by(col(JobRow.tenant))
            ).all()
            return {tenant: seq for tenant, seq in found if seq is not None}

    def claim(self, max_documents: int, tenant: str | None = None) -> list[JobRow]:
        """Mark the oldest queued jobs (of `tenant`, when given) running, as many as fit
        `max_documents` together (always at least one), and return them in order of
        arrival."""
        with Session(self.engine, expire_on_commit=False) as s:
            query = select(JobRow.seq, JobRow.documents).where(col(JobRow.status) == "queued")
            if tenant is not None:
                query = query.where(col(JobRow.tenant) == tenant)
            queued = s.exec(query.order_by(col(JobRow.seq)).limit(1000)).all()
            chosen: list[int | None] = []
            total = 0
            for seq, documents in queued:
                if chosen and total + documents > max_documents:
                    break
                chosen.append(seq)
                total += documents
            if not chosen:
                return []
            # Only the rows this update changed: another writer's claim of the same rows
            # in between (both read them queued) leaves them running, but not ours.
            mine = s.exec(
                update(JobRow)
                .where(col(JobRow.seq).in_(chosen), col(JobRow.status) == "queued")
                .values(
                    status="running",
                    started_at=_now(),
                    attempts=JobRow.attempts + 1,
                    documents_done=0,  # an interrupted attempt's progress starts over
                    chunks_done=0,
                    chunks_planned=None,
                )
                .returning(col(JobRow.seq))
            ).all()
            s.commit()
            rows = s.exec(select(JobRow).where(col(JobRow.seq).in_([m.seq for m in mine]))).all()
            return sorted(rows, key=lambda r: r.seq or 0)

    def resume_interrupted(self, outage: bool = False) -> tuple[int, int]:
        """Jobs left `running` by a writer that stopped: queued again, or failed once they
        have been interrupted MAX_ATTEMPTS times. Only the one writer calls this, when it
        starts, so no job it finds running is being worked on. (resumed, failed).

        `outage`: the writer did not stop, a service it needs (the catalog, the index
        store) was away: every running job is queued again with its attempt given back,
        as `release` does, for an outage is no fault of the job and fails none."""
        if outage:
            return self._hand_back(col(JobRow.status) == "running"), 0
        reason = job_error(
            f"the writer stopped {MAX_ATTEMPTS} times while running this job; "
            "nothing of it was applied"
        )
        with Session(self.engine) as s:
            running = s.exec(select(JobRow).where(col(JobRow.status) == "running")).all()
            resumed, failed = 0, []
            for row in running:
                if row.attempts >= MAX_ATTEMPTS:
                    row.status, row.finished_at = "failed", _now()
                    row.errors_json, row.records_json = json.dumps([reason]), "[]"
                    failed.append(row.job_id)
                else:
                    row.status, row.started_at = "queued", None
                    resumed += 1
                s.add(row)
            # The jobs' rows are updated (locked, on PostgreSQL) before their slices are
            # deleted, as `finish` and `fail` do: an embedder's plan that holds a job's row
            # (`EmbedSlices.plan`) is either deleted here or finds the job ended.
            s.flush()
            forget(s.connection(), failed)
            s.commit()
        return resumed, len(failed)

    def release(self, job_ids: Sequence[str]) -> None:
        """Running jobs handed back, untouched, by a writer stopping in order (not counted
        as an interruption): the next writer takes them as if never claimed."""
        self._hand_back(col(JobRow.job_id).in_(list(job_ids)), col(JobRow.status) == "running")

    def _hand_back(self, *where: Any) -> int:
        """The running jobs `where` says queued again, their attempt given back; how many."""
        with Session(self.engine) as s:
            handed = s.exec(
                update(JobRow)
                .where(*where)
                .values(status="queued", started_at=None, attempts=JobRow.attempts - 1)
            )
            s.commit()
        return int(handed.rowcount)

    def records_of(self, job_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """The current records of running jobs (after any patch), read under the writer lock
        just before their generation is planned; in the order of `job_ids` (a later job's
        copy of a version wins)."""
        with Session(self.engine) as s:
            rows = s.exec(select(JobRow).where(col(JobRow.job_id).in_(list(job_ids)))).all()
            found = {r.job_id: r.records for r in rows}
            return {job_id: found[job_id] for job_id in job_ids if job_id in found}

    def finish(
        self,
        connection: Connection,
        results: Sequence[JobResult],
        generation: int,
        claimed: Claims | None = None,
    ) -> None:
        """Mark jobs succeeded, on the connection of the transaction that commits their
        generation. Their records are dropped: the catalog holds the documents now. With
        `claimed`, only a job still in the claim named there (`_in_claim`)."""
        now = _now()
        for result in results:
            connection.execute(
                update(JobRow)
                .where(*_in_claim(result.job_id, claimed))
                .values(
                    status="succeeded",
                    documents_done=JobRow.documents,
                    chunks=result.chunks,
                    unchanged=result.unchanged,
                    index_generation=generation,
                    finished_at=now,
                    records_json="[]",
                )
            )
        forget(connection, [r.job_id for r in results])  # the handover ends with the job

    def finish_unchanged(
        self, results: Sequence[JobResult], generation: int | None, claimed: Claims | None = None
    ) -> None:
        """Jobs whose documents were all in the catalog already: done without a generation."""
        with Session(self.engine) as s:
            self.finish(s.connection(), results, generation or 0, claimed)
            s.commit()

    def fail(
        self,
        job_ids: Sequence[str],
        errors: Sequence[dict[str, Any]],
        connection: Connection | None = None,
        claimed: Claims | None = None,
    ) -> None:
        """Mark jobs failed, with these errors; on `connection` when given (the transaction
        that commits the generation of the other jobs of their claim). With `claimed`,
        only a job still in the claim named there (`_in_claim`)."""

        def failed(job_id: str) -> Any:
            return (
                update(JobRow)
                .where(*_in_claim(job_id, claimed))
                .values(
                    status="failed",
                    errors_json=json.dumps(list(errors)),
                    finished_at=_now(),
                    records_json="[]",
                )
            )

        if connection is not None:
            for job_id in job_ids:
                connection.execute(failed(job_id))
            forget(connection, job_ids)
            return
        with Session(self.engine) as s:
            for job_id in job_ids:
                s.exec(failed(job_id))
            forget(s.connection(), job_ids)
            s.commit()

    def progress(self, done: Mapping[str, tuple[int, int, int]]) -> None:
        """job_id -> (documents done, chunks done, chunks planned), for running jobs."""
        with Session(self.engine) as s:
            for job_id, (documents, chunks, planned) in done.items():
                s.exec(
                    update(JobRow)
                    .where(col(JobRow.job_id) == job_id, col(JobRow.status) == "running")
                    .values(documents_done=documents, chunks_done=chunks, chunks_planned=planned)
                )
            s.commit()

    def counts(self) -> dict[str, int]:
        """Jobs by status, every tenant together (for operators' metrics)."""
        with Session(self.engine) as s:
            found = s.exec(select(JobRow.status, func.count()).group_by(col(JobRow.status))).all()
            return dict(found)


def patch_pending(
    connection: Connection,
    tenant: str,
    doc_id: str,
    version: str | None,
    acl: Sequence[str] | None,
    *,
    count_only: bool = False,
) -> int:
    """Apply an ACL change (`acl`) or a delete (`acl` None) to the records of the tenant's
    queued and running jobs; the number of records changed or dropped. The ingest pipeline
    calls it on the transaction that commits the change's generation, so that a generation
    that fails leaves the queued copies as they were too: a copy patched alone brought an
    ACL the caller was told had not been set, or dropped a version it was told had not
    been deleted. `count_only`: how many it would change, changing nothing (to plan with)."""
    pending = (col(JobRow.tenant) == tenant, col(JobRow.status).in_(PENDING))
    rows = connection.execute(select(JobRow.job_id, JobRow.records_json).where(*pending)).all()
    touched = 0
    for job_id, records_json in rows:
        records, kept = json.loads(records_json), []
        for record in records:
            hit = record["doc_id"] == doc_id and version in (None, record["version"])
            if hit and acl is None:
                touched += 1
                continue
            if hit and acl is not None and record["acl"] != list(acl):
                record = {**record, "acl": list(acl)}
                touched += 1
            kept.append(record)
        if kept != records and not count_only:
            connection.execute(
                update(JobRow)
                .where(col(JobRow.job_id) == job_id, *pending)
                .values(records_json=json.dumps(kept))
            )
    return touched
