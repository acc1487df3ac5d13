"""Erasure requests: which deletes still have bytes to erase, and how far their erasure got.

A delete (or a tenant's removal, a version past its retention, `gateway erase`) records a
request in the transaction that commits it. The writer erases every pending request at once
(`gateway/ingest/erasure.py`): it writes an erasure generation (status `written`, with its
number), waits until no replica serves an older one, then retires the older generations'
files and objects (status `done`, with the report). Whoever runs it holds the writer lock,
and the status is the only state, so a writer killed at any step resumes from here.

A replica serving the erasure generation or a newer one removes its own copies of older
generations (`barrier`), also when it was down while the erasure ran.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine, func, insert, update
from sqlmodel import Field, Session, SQLModel, col, select

PENDING, WRITTEN, DONE = "pending", "written", "done"


class ErasureRow(SQLModel, table=True):
    __tablename__ = "erasures"
    seq: int | None = Field(default=None, primary_key=True)
    tenant: str  # whose delete asked for it (IDs only: never what was erased)
    reason: str  # delete | superseded | tenant | operator | replaced (a version sent again changed)
    requested_at: dt.datetime
    due_at: dt.datetime | None = None  # None: requested_at + the policy's erase_within_s / 2
    status: str = Field(default=PENDING, index=True)
    generation: int | None = None  # the erasure generation, once written
    finished_at: dt.datetime | None = None
    report_json: str = "{}"

    @property
    def report(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.report_json)
        return found


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _aware(moment: dt.datetime) -> dt.datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)  # SQLite drops it


def request_on(
    connection: Connection, tenant: str, reason: str, due_at: dt.datetime | None = None
) -> None:
    """Record a request on the connection of the transaction that makes the delete."""
    connection.execute(
        insert(ErasureRow).values(
            tenant=tenant,
            reason=reason,
            requested_at=_now(),
            due_at=due_at,
            status=PENDING,
            report_json="{}",
        )
    )


class Erasures:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def request(self, tenant: str, reason: str, due_at: dt.datetime | None = None) -> int:
        """A request of its own (an operator's); its number."""
        with Session(self.engine) as s:
            row = ErasureRow(
                tenant=tenant, reason=reason, requested_at=_now(), due_at=due_at, status=PENDING
            )
            s.add(row)
            s.commit()
            assert row.seq is not None
            return row.seq

    def open(self) -> list[ErasureRow]:
        """Requests not done yet, oldest first."""
        with Session(self.engine) as s:
            query = select(ErasureRow).where(col(ErasureRow.status) != DONE)
            return list(s.exec(query.order_by(col(ErasureRow.seq))))

    def due(self, erase_within_s: float) -> bool:
        """Whether an erasure should run now: a request written and not retired, or a
        pending one that has waited half its time (the other half is for the erasure)."""
        now = _now()
        for row in self.open():
            if row.status == WRITTEN:
                return True
            due = row.due_at or row.requested_at + dt.timedelta(seconds=erase_within_s / 2)
            if _aware(due) <= now:
                return True
        return False

    def get(self, seq: int) -> ErasureRow | None:
        with Session(self.engine) as s:
            return s.get(ErasureRow, seq)

    def mark_written(self, connection: Connection, seqs: Sequence[int], generation: int) -> None:
        connection.execute(
            update(ErasureRow)
            .where(col(ErasureRow.seq).in_(list(seqs)), col(ErasureRow.status) == PENDING)
            .values(status=WRITTEN, generation=generation)
        )

    def mark_done(self, seqs: Sequence[int], report: dict[str, Any]) -> None:
        with Session(self.engine) as s:
            s.exec(
                update(ErasureRow)
                .where(col(ErasureRow.seq).in_(list(seqs)))
                .values(status=DONE, finished_at=_now(), report_json=json.dumps(report))
            )
            s.commit()

    def barrier(self, served: int) -> int | None:
        """The newest erasure generation at or below `served`: nothing older may be kept
        by a process serving `served`."""
        query = select(func.max(ErasureRow.generation)).where(
            col(ErasureRow.status).in_((WRITTEN, DONE)), col(ErasureRow.generation) <= served
        )
        with Session(self.engine) as s:
            found = s.exec(query).one()
            return int(found) if found is not None else None
