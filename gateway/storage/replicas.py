"""The serving processes of a deployment, and the generation each serves.

Every server records its served generation here when it swaps one in, and again every
second (`seen_at`). A change that must be enforced by every replica before it is answered
(an ACL change, a delete, `?wait=true`) waits until each replica seen recently serves that
generation or a newer one. A replica that stopped being seen (killed, cut off from the
database) is not waited for: it cannot answer requests with a stale view for long either,
since it checks the catalog itself.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import uuid

from sqlalchemy import Engine
from sqlmodel import Field, Session, SQLModel, col, delete, select

FRESH_S = 3.0  # a replica not seen for longer is taken to be gone


class ReplicaRow(SQLModel, table=True):
    __tablename__ = "replicas"
    replica_id: str = Field(primary_key=True)
    label: str  # host:pid, for operators
    served_generation: int
    seen_at: dt.datetime
    directory_version: int = 0  # the directory's version this replica enforces (directory.py)


class Replicas:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.replica_id = uuid.uuid4().hex
        self.label = f"{socket.gethostname()}:{os.getpid()}"

    def report(self, served_generation: int) -> None:
        """This replica serves `served_generation` now."""
        with Session(self.engine) as s:
            row = s.get(ReplicaRow, self.replica_id) or ReplicaRow(
                replica_id=self.replica_id, label=self.label, served_generation=0, seen_at=_now()
            )
            row.served_generation, row.seen_at = served_generation, _now()
            s.add(row)
            s.commit()

    def leave(self) -> None:
        with Session(self.engine) as s:
            s.exec(delete(ReplicaRow).where(col(ReplicaRow.replica_id) == self.replica_id))
            s.commit()

    def behind(self, generation: int) -> list[str]:
        """Labels of the replicas seen recently that serve an older generation."""
        since = _now() - dt.timedelta(seconds=FRESH_S)
        with Session(self.engine) as s:
            rows = s.exec(
                select(ReplicaRow).where(col(ReplicaRow.served_generation) < generation)
            ).all()
            return [r.label for r in rows if _aware(r.seen_at) >= since]

    def oldest_served(self) -> int | None:
        """The oldest generation a replica seen recently serves (what must be kept)."""
        since = _now() - dt.timedelta(seconds=FRESH_S)
        with Session(self.engine) as s:
            rows = s.exec(select(ReplicaRow)).all()
            served = [r.served_generation for r in rows if _aware(r.seen_at) >= since]
            return min(served) if served else None


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _aware(moment: dt.datetime) -> dt.datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)  # SQLite drops it
