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
transaction that ends it (succeeded or failed: `forget`), so no text-derived bytes stay; a
plan is inserted only while its job is queued or running (`plan`), and the writer (as
it starts) and an erasure sweep any row of an ended job they find (`sweep`). An erasure
drops the vectors of versions deleted from a job's records since (`scrub`). A slice an
embedder failed on is open with `claimed_by` still set (`give_up`): only the writer takes
it. So is a slice embedders claimed MAX_EMBEDDER_CLAIMS times without handing it over
(`embedder_claims`): an embedder killed while it embeds (out of memory, say) catches no
error to give it up, and every embedder that took the claim over would die on it again.

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

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    UniqueConstraint,
    and_,
    case,
    delete,
    or_,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, Session, SQLModel, col, select

from gateway.domain import version_key

OPEN, CLAIMED, EMBEDDED = "open", "claimed", "embedded"
CANDIDATES = 200  # slices looked at per claim
# Embedder claims of one slice that may end without a handover (each expired: its
# embedder died or stalled) before only the writer takes it.
MAX_EMBEDDER_CLAIMS = 3


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
    # The claimer's token, `host:pid:role:random` (an embedder's per claim, the writer's per
    # process); on an open slice, the embedder that gave it up to the writer.
    claimed_by: str | None = None
    heartbeat_at: dt.datetime | None = None
    # Claims embedders made of it (migration 0014); one handed back in order (`release`)
    # does not count.
    embedder_claims: int = 0
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


def _held_by(token: str) -> ColumnElement[bool]:
    """Slices this token holds: claimed by it, not handed over, given up or taken over."""
    return and_(col(SliceRow.claimed_by) == token, col(SliceRow.status) == CLAIMED)


def _of_role(role: str) -> ColumnElement[bool]:
    """Slices whose `claimed_by` is a token of this role (`claim_token`'s third part)."""
    return col(SliceRow.claimed_by).like(f"%:{role}:%")


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
        slice, so nobody plans it again); False when another process planned it first,
        or the job is no longer queued or running."""
        from gateway.storage.jobs import PENDING, JobRow

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
                s.flush()
            except IntegrityError:  # (job_id, ordinal) is unique: planned by another
                s.rollback()
                return False
            # The job must still be queued or running, in this transaction: a plan read
            # before the job ended and inserted after its `forget` would stay for good. On
            # SQLite the insert holds the write lock, so the job cannot end before the
            # commit; on PostgreSQL the job's row is locked (FOR SHARE), so a writer ending
            # it either waits for this commit (and its `forget` then deletes these rows)
            # or ended it first (and the job is not found here).
            alive = s.exec(
                select(JobRow.job_id)
                .where(col(JobRow.job_id) == job_id, col(JobRow.status).in_(PENDING))
                .with_for_update(read=True)
            ).first()
            if alive is None:
                s.rollback()
                return False
            s.commit()
        return True

    def sweep(self) -> int:
        """Delete the slices of jobs no longer queued or running (rows an earlier release
        left behind: the handover must end with its job); how many went."""
        from gateway.storage.jobs import PENDING, JobRow

        pending = select(JobRow.job_id).where(col(JobRow.status).in_(PENDING))
        with Session(self.engine) as s:
            gone = s.exec(delete(SliceRow).where(col(SliceRow.job_id).not_in(pending)))
            s.commit()
            return int(gone.rowcount or 0)

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
        embedder: bool = False,
    ) -> list[SliceRow]:
        """Claim the oldest claimable slices (of `jobs` or `tenant` when given) until
        `max_chunks` (at least one slice); an `embedder` leaves those given up to the
        writer."""
        free = _free(timeout_s, embedder)
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
            claims = SliceRow.embedder_claims + (1 if embedder else 0)
            s.exec(
                update(SliceRow)
                .where(col(SliceRow.id).in_(chosen), free)
                .values(
                    status=CLAIMED, claimed_by=token, heartbeat_at=_now(), embedder_claims=claims
                )
            )
            s.commit()
            # Only the slices chosen now: the writer's token is its process's, and it may
            # hold other claims of its own (`gateway/ingest/handover.py`).
            rows = s.exec(
                select(SliceRow).where(
                    col(SliceRow.id).in_(chosen), col(SliceRow.claimed_by) == token
                )
            ).all()
            return sorted(
                (r for r in rows if r.status == CLAIMED),
                key=lambda r: (r.job_seq, r.ordinal),
            )

    def tenants_open(self, timeout_s: float) -> dict[str, int]:
        """Tenants with slices an embedder may claim, each with its oldest job's arrival."""
        free = _free(timeout_s, embedder=True)
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
                .where(col(SliceRow.status) == CLAIMED, _of_role("writer"))
                .values(status=OPEN, claimed_by=None, heartbeat_at=None)
            )
            s.commit()
            return int(released.rowcount or 0)

    def heartbeat(self, token: str) -> None:
        with Session(self.engine) as s:
            s.exec(update(SliceRow).where(_held_by(token)).values(heartbeat_at=_now()))
            s.commit()

    def held(self, token: str, slice_ids: Sequence[int]) -> set[int]:
        """Of these slices, those `token` still holds (the others were taken over after
        their claim expired, or opened again by an erasure)."""
        with Session(self.engine) as s:
            found = s.exec(
                select(SliceRow.id).where(col(SliceRow.id).in_(list(slice_ids)), _held_by(token))
            ).all()
            return {i or 0 for i in found}

    def give_up(self, slice_id: int, token: str) -> None:
        """An embedder failed on this slice: open at once, for the writer only (`claimed_by`
        keeps the token, which embedders' claims skip), so that an embedder-only fault (an
        older embedder that cannot read a newer planner's chunking options, say) costs
        one try, not a claim timeout per embedder forever."""
        with Session(self.engine) as s:
            s.exec(
                update(SliceRow)
                .where(col(SliceRow.id) == slice_id, _held_by(token))
                .values(status=OPEN, heartbeat_at=_now())
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
                .where(col(SliceRow.id) == slice_id, _held_by(token))
                .values(**values)
            )
            s.commit()
            return bool(done.rowcount)

    def reopen_writer_held(self, job_ids: Sequence[str]) -> None:
        """Slices of these jobs that a writer embedded and kept in a memory it no longer
        has (it restarted, or embeds its claim again), or claimed for a write it gave up
        (a batch written again job by job): open to be claimed again. One writer holds the
        lease, and it embeds a job for one write at a time, so no such claim is alive."""
        held_by_writer = or_(
            and_(col(SliceRow.status) == EMBEDDED, col(SliceRow.vectors).is_(None)),
            and_(col(SliceRow.status) == CLAIMED, _of_role("writer")),
        )
        with Session(self.engine) as s:
            s.exec(
                update(SliceRow)
                .where(
                    col(SliceRow.job_id).in_(list(job_ids)),
                    held_by_writer,
                    col(SliceRow.chunks) > 0,
                )
                .values(status=OPEN, claimed_by=None)
            )
            s.commit()

    def release(self, token: str) -> None:
        """Claims handed back untouched (a process stopping in order, an embedder whose
        catalog is away): an embedder's claim is not counted against the slice."""
        counted = and_(_of_role("embedder"), col(SliceRow.embedder_claims) > 0)
        given_back = case((counted, SliceRow.embedder_claims - 1), else_=SliceRow.embedder_claims)
        with Session(self.engine) as s:
            s.exec(
                update(SliceRow)
                .where(_held_by(token))
                .values(status=OPEN, claimed_by=None, embedder_claims=given_back)
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

    def scrub(self) -> int:
        """Erasure (docs/security.md, "Erasure"): no vector of a version deleted from its
        queued job stays here. Each slice whose versions are not all in its job's records any more
        loses them: its handed-over vectors, digests and chunk IDs are cleared and it is
        open again (the rest is embedded again, from the records as they are), a claim in
        flight is cancelled (its embedder read the records before the delete: its
        handover now finds the claim gone), and a slice left with no version is done.
        Slices of ended jobs are deleted. How many slices were cleared or deleted.

        Every change is one statement on the row as it is then (no value read earlier is
        written back), so a claim or handover racing with it is either cleared or
        refused; a version once gone from a job's records never comes back to them."""
        from gateway.storage.jobs import PENDING, JobRow

        changed = self.sweep()
        with Session(self.engine) as s:
            slices = s.exec(select(SliceRow.id, SliceRow.job_id, SliceRow.keys_json)).all()
            found = s.exec(
                select(JobRow.job_id, JobRow.tenant, JobRow.records_json).where(
                    col(JobRow.job_id).in_({job_id for _, job_id, _ in slices}),
                    col(JobRow.status).in_(PENDING),
                )
            ).all()
            present = {job_id: _keys_of(tenant, records) for job_id, tenant, records in found}
            for slice_id, job_id, keys_json in slices:
                keys: list[str] = json.loads(keys_json)
                kept = [k for k in keys if k in present.get(job_id, ())]
                if kept == keys:
                    continue
                s.exec(
                    update(SliceRow)
                    .where(col(SliceRow.id) == slice_id)
                    .values(keys_json=json.dumps(kept), **_cleared(bool(kept)))
                )
                changed += 1
            s.commit()
        return changed


def _free(timeout_s: float, embedder: bool) -> ColumnElement[bool]:
    """Slices a claim may take: open ones (for an embedder, not one given up to the
    writer), and claims whose heartbeat is older than `timeout_s`; for an embedder, none
    that embedders claimed MAX_EMBEDDER_CLAIMS times already."""
    expired = _now() - dt.timedelta(seconds=timeout_s)
    opened = col(SliceRow.status) == OPEN
    if embedder:
        opened = and_(opened, col(SliceRow.claimed_by).is_(None))
    free = or_(opened, and_(col(SliceRow.status) == CLAIMED, col(SliceRow.heartbeat_at) < expired))
    if embedder:
        free = and_(free, col(SliceRow.embedder_claims) < MAX_EMBEDDER_CLAIMS)
    return free


def _keys_of(tenant: str, records_json: str) -> set[str]:
    """The version keys of a job's records as they are now."""
    return {
        version_key(tenant, str(r["doc_id"]), str(r["version"])) for r in json.loads(records_json)
    }


def _cleared(kept: bool) -> dict[str, object]:
    """A slice's new state once versions left it: no handover, and open to be embedded
    again (a slice the writer embedded stays its; one given up to the writer stays so),
    or, with no version kept, done with nothing to embed."""
    handover = dict.fromkeys(
        (
            "model_name",
            "dim",
            "numerics",
            "chunk_ids_json",
            "digests",
            "vectors",
            "sentence_sizes_json",
            "sentence_vectors",
        )
    )
    if not kept:
        return handover | {"status": EMBEDDED, "chunks": 0, "claimed_by": None}
    writers = and_(col(SliceRow.status) == EMBEDDED, col(SliceRow.vectors).is_(None))
    return handover | {
        "status": case((writers, EMBEDDED), else_=OPEN),
        "claimed_by": case((col(SliceRow.status) == OPEN, col(SliceRow.claimed_by)), else_=None),
    }
