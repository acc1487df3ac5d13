"""The handover of embedded slices, from `gateway worker --embed-only` processes to the
one committing writer, in the catalog's database (table `embed_slices`, migration 0012).

A queued or running ingest job is cut into slices (consecutive document versions of the
job, about `ingest.slice_chunks` chunks each) by whichever process first reaches it; the
plan is one insert, so two planners never disagree. A slice is `open`, then `claimed` by
one process (an embedder or the writer) whose heartbeat keeps the claim, then
`embedded`: by an embedder, with its vectors stored here (float32 chunk vectors, float16
sentence vectors, each chunk's ID and a digest of the text embedded, the model and the
numerics); by the writer, with none (they are in its memory). A claim whose heartbeat is
older than the claimer's timeout is taken over by the next process that looks, so an
embedder killed mid-slice costs that slice's work once more, never a second copy in the
index: only the writer commits, each chunk once. The rows of a job are deleted in the
transaction that ends it (succeeded or failed: `forget`), so no text-derived bytes stay.

Claims are one conditional UPDATE on SQLite (`WHERE claimed_by IS NULL OR expired`); on
PostgreSQL the candidate rows are locked with `SELECT ... FOR UPDATE SKIP LOCKED` first,
so concurrent claimers pass each other instead of queueing.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, UniqueConstraint, and_, delete, or_, update
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, col, select

OPEN, CLAIMED, EMBEDDED = "open", "claimed", "embedded"
CANDIDATES = 200  # slices looked at per claim


class SliceRow(SQLModel, table=True):
    __tablename__ = "embed_slices"
    __table_args__ = (UniqueConstraint("job_id", "ordinal", name="uq_embed_slices_job_ordinal"),)
    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(index=True)  # unique with `ordinal` (the plan is inserted once)
    job_seq: int  # the job's arrival: slices are taken oldest job first
    tenant: str
    ordinal: int
    keys_json: str  # the version keys (IDs only) of the job this slice covers, in order
    chunking: str  # the chunking options the plan was made with (JSON)
    chunks: int  # planned
    status: str = Field(default=OPEN, index=True)
    claimed_by: str | None = None  # a token per claim: `host:pid:role:random`
    heartbeat_at: dt.datetime | None = None
    # Filled by an embedder's handover; all None when the writer embedded the slice.
    model_name: str | None = None
    dim: int | None = None
    numerics: str | None = None
    chunk_ids_json: str | None = None  # `Chunk.scoped_id` of each vector, in order
    digests: bytes | None = None  # 16 bytes per chunk: sha256 of the text embedded
    vectors: bytes | None = None  # float32, chunks x dim
    sentence_sizes_json: str | None = None  # bytes of packed sentence vectors per chunk
    sentence_vectors: bytes | None = None

    @property
    def keys(self) -> list[str]:
        keys: list[str] = json.loads(self.keys_json)
        return keys


@dataclass(frozen=True)
class PlannedSlice:
    keys: Sequence[str]
    chunks: int


@dataclass(frozen=True)
class SliceState:
    slice_id: int
    keys: Sequence[str]
    status: str
    handed: bool  # embedded by an embedder: its vectors are here


@dataclass(frozen=True)
class Handover:
    """An embedder's result for one slice."""

    model_name: str
    dim: int
    numerics: str
    chunk_ids: Sequence[str]
    digests: bytes
    vectors: bytes
    sentence_sizes: Sequence[int]
    sentence_vectors: bytes


def claim_token(role: str) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{role}:{uuid.uuid4().hex[:8]}"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def forget(connection: Connection, job_ids: Sequence[str]) -> None:
    """Delete the slices of ended jobs, in the transaction that ends them."""
    if job_ids:
        connection.execute(delete(SliceRow).where(col(SliceRow.job_id).in_(list(job_ids))))


class EmbedSlices:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def planned(self, job_ids: Sequence[str]) -> set[str]:
        """Those of `job_ids` whose slices are planned."""
        with Session(self.engine) as s:
            found = s.exec(
                select(SliceRow.job_id).where(col(SliceRow.job_id).in_(list(job_ids))).distinct()
            ).all()
            return set(found)

    def plan(
        self, job_id: str, job_seq: int, tenant: str, chunking: str, slices: Sequence[PlannedSlice]
    ) -> bool:
        """Record a job's slices (a job with nothing to embed gets one empty, embedded
        slice, so nobody plans it again); False when another process planned it first."""
        now = _now()
        rows = [
            SliceRow(
                job_id=job_id,
                job_seq=job_seq,
                tenant=tenant,
                ordinal=n,
                keys_json=json.dumps(list(planned.keys)),
                chunking=chunking,
                chunks=planned.chunks,
                status=OPEN if planned.chunks else EMBEDDED,
                heartbeat_at=now,
            )
            for n, planned in enumerate(slices or [PlannedSlice((), 0)])
        ]
        with Session(self.engine) as s:
            s.add_all(rows)
            try:
                s.commit()
            except IntegrityError:  # (job_id, ordinal) is unique: planned by another
                s.rollback()
                return False
        return True

    def unplanned_jobs(self, limit: int) -> list[tuple[str, int, str]]:
        """(job_id, seq, tenant) of queued or running jobs without slices, oldest first."""
        from gateway.storage.jobs import PENDING, JobRow

        planned = select(SliceRow.job_id).distinct()
        with Session(self.engine) as s:
            found = s.exec(
                select(JobRow.job_id, JobRow.seq, JobRow.tenant)
                .where(col(JobRow.status).in_(PENDING), col(JobRow.job_id).not_in(planned))
                .order_by(col(JobRow.seq))
                .limit(limit)
            ).all()
            return [(job_id, seq or 0, tenant) for job_id, seq, tenant in found]

    def claim(
        self,
        token: str,
        timeout_s: float,
        max_chunks: int,
        *,
        jobs: Sequence[str] | None = None,
        tenant: str | None = None,
    ) -> list[SliceRow]:
        """Claim the oldest claimable slices (of `jobs` or `tenant` when given) until
        `max_chunks` (at least one slice)."""
        expired = _now() - dt.timedelta(seconds=timeout_s)
        free = or_(
            col(SliceRow.status) == OPEN,
            and_(col(SliceRow.status) == CLAIMED, col(SliceRow.heartbeat_at) < expired),
        )
        query = select(SliceRow.id, SliceRow.chunks).where(free, col(SliceRow.chunks) > 0)
        if jobs is not None:
            query = query.where(col(SliceRow.job_id).in_(list(jobs)))
        if tenant is not None:
            query = query.where(col(SliceRow.tenant) == tenant)
        query = query.order_by(col(SliceRow.job_seq), col(SliceRow.ordinal)).limit(CANDIDATES)
        postgres = self.engine.dialect.name == "postgresql"
        if postgres:
            query = query.with_for_update(skip_locked=True)
        with Session(self.engine, expire_on_commit=False) as s:
            chosen: list[int] = []
            total = 0
            for slice_id, chunks in s.exec(query).all():
                if chosen and total + chunks > max_chunks:
                    break
                chosen.append(slice_id or 0)
                total += chunks
            if not chosen:
                return []
            # On SQLite the condition is the claim: a row another process took meanwhile
            # no longer matches it. On PostgreSQL the rows are locked already.
            s.exec(
                update(SliceRow)
                .where(col(SliceRow.id).in_(chosen), free)
                .values(status=CLAIMED, claimed_by=token, heartbeat_at=_now())
            )
            s.commit()
            rows = s.exec(select(SliceRow).where(col(SliceRow.claimed_by) == token)).all()
            return sorted(
                (r for r in rows if r.status == CLAIMED),
                key=lambda r: (r.job_seq, r.ordinal),
            )

    def tenants_open(self, timeout_s: float) -> dict[str, int]:
        """Tenants with slices an embedder may claim, each with its oldest job's arrival."""
        expired = _now() - dt.timedelta(seconds=timeout_s)
        free = or_(
            col(SliceRow.status) == OPEN,
            and_(col(SliceRow.status) == CLAIMED, col(SliceRow.heartbeat_at) < expired),
        )
        with Session(self.engine) as s:
            rows = s.exec(
                select(SliceRow.tenant, SliceRow.job_seq).where(free, col(SliceRow.chunks) > 0)
            ).all()
        out: dict[str, int] = {}
        for tenant, seq in rows:
            out[tenant] = min(out.get(tenant, seq), seq)
        return out

    def release_writers_claims(self) -> int:
        """Open again the slices an earlier writer claimed, at once rather than after the
        claim timeout: called by the writer that has just taken the lease, which proves
        every earlier writer gone. Embedders' claims keep their own timeout."""
        with Session(self.engine) as s:
            released = s.exec(
                update(SliceRow)
                .where(col(SliceRow.status) == CLAIMED, col(SliceRow.claimed_by).like("%:writer:%"))
                .values(status=OPEN, claimed_by=None, heartbeat_at=None)
            )
            s.commit()
            return int(released.rowcount or 0)

    def heartbeat(self, token: str) -> None:
        with Session(self.engine) as s:
            s.exec(
                update(SliceRow)
                .where(col(SliceRow.claimed_by) == token, col(SliceRow.status) == CLAIMED)
                .values(heartbeat_at=_now())
            )
            s.commit()

    def hand_over(self, slice_id: int, token: str, result: Handover | None) -> bool:
        """Mark a claimed slice embedded: with an embedder's vectors, or (`None`) by the
        writer, which keeps them; False when the claim was lost (expired and taken)."""
        values: dict[str, object] = {"status": EMBEDDED, "heartbeat_at": _now()}
        if result is not None:
            values |= {
                "model_name": result.model_name,
                "dim": result.dim,
                "numerics": result.numerics,
                "chunk_ids_json": json.dumps(list(result.chunk_ids)),
                "digests": result.digests,
                "vectors": result.vectors,
                "sentence_sizes_json": json.dumps(list(result.sentence_sizes)),
                "sentence_vectors": result.sentence_vectors,
            }
        with Session(self.engine) as s:
            done = s.exec(
                update(SliceRow)
                .where(
                    col(SliceRow.id) == slice_id,
                    col(SliceRow.claimed_by) == token,
                    col(SliceRow.status) == CLAIMED,
                )
                .values(**values)
            )
            s.commit()
            return bool(done.rowcount)

    def reopen_writer_held(self, job_ids: Sequence[str]) -> None:
        """Slices of these jobs that a writer embedded and kept in a memory it no longer
        has (it restarted, or embeds its claim again): open to be claimed again."""
        with Session(self.engine) as s:
            s.exec(
                update(SliceRow)
                .where(
                    col(SliceRow.job_id).in_(list(job_ids)),
                    col(SliceRow.status) == EMBEDDED,
                    col(SliceRow.vectors).is_(None),
                    col(SliceRow.chunks) > 0,
                )
                .values(status=OPEN, claimed_by=None)
            )
            s.commit()

    def release(self, token: str) -> None:
        """Claims handed back untouched (a process stopping in order)."""
        with Session(self.engine) as s:
            s.exec(
                update(SliceRow)
                .where(col(SliceRow.claimed_by) == token, col(SliceRow.status) == CLAIMED)
                .values(status=OPEN, claimed_by=None)
            )
            s.commit()

    def state(self, job_ids: Sequence[str]) -> list[SliceState]:
        """The slices of these jobs, without their vectors (`handed` reads those)."""
        query = select(
            SliceRow.id,
            SliceRow.keys_json,
            SliceRow.status,
            col(SliceRow.vectors).is_not(None),
        ).where(col(SliceRow.job_id).in_(list(job_ids)), col(SliceRow.chunks) > 0)
        with Session(self.engine) as s:
            return [
                SliceState(slice_id or 0, json.loads(keys), status, bool(handed))
                for slice_id, keys, status, handed in s.exec(query).all()
            ]

    def handed(self, slice_ids: Sequence[int]) -> list[SliceRow]:
        """Embedded slices with an embedder's vectors, whole."""
        with Session(self.engine) as s:
            return list(
                s.exec(
                    select(SliceRow).where(
                        col(SliceRow.id).in_(list(slice_ids)),
                        col(SliceRow.status) == EMBEDDED,
                        col(SliceRow.vectors).is_not(None),
                    )
                ).all()
            )
