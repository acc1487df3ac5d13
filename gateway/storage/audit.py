"""The audit trail's table: one ID-only record per request to a protected route.

Written in batches by `gateway/telemetry/audit.py`, off the request path; read by
`GET /admin/audit` and `gateway audit export`; purged by the writer once older than the
policy's `audit.retention_days`. A record names who asked (subject, tenant), which route
answered with which status, under which policy version and index generation, and which
document and chunk IDs came back or were cited; never a query, a text or a token.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from sqlalchemy import Engine, insert, text
from sqlmodel import Field, Session, SQLModel, col, delete, select


class AuditRow(SQLModel, table=True):
    __tablename__ = "audit"
    id: int | None = Field(default=None, primary_key=True)  # order of recording
    time: dt.datetime = Field(index=True)  # when the request arrived (UTC)
    tenant: str = Field(index=True)
    subject: str = Field(index=True)
    route: str  # the route's template, e.g. /documents/{doc_id}
    status: int
    trace_id: str | None = None
    policy_version: str | None = None
    index_generation: int | None = None
    doc_ids_json: str = "[]"
    chunk_ids_json: str = "[]"
    degraded_json: str = "[]"
    abstain_reason: str | None = None
    duration_ms: float


@dataclass(frozen=True)
class AuditRecord:
    time: dt.datetime
    tenant: str
    subject: str
    route: str
    status: int
    duration_ms: float
    trace_id: str | None = None
    policy_version: str | None = None
    index_generation: int | None = None
    doc_ids: tuple[str, ...] = ()
    chunk_ids: tuple[str, ...] = ()
    degraded: tuple[str, ...] = ()
    abstain_reason: str | None = None

    def row(self) -> dict[str, object]:
        return {
            "time": self.time,
            "tenant": self.tenant,
            "subject": self.subject,
            "route": self.route,
            "status": self.status,
            "trace_id": self.trace_id,
            "policy_version": self.policy_version,
            "index_generation": self.index_generation,
            "doc_ids_json": json.dumps(list(self.doc_ids)),
            "chunk_ids_json": json.dumps(list(self.chunk_ids)),
            "degraded_json": json.dumps(list(self.degraded)),
            "abstain_reason": self.abstain_reason,
            "duration_ms": round(self.duration_ms, 3),
        }


def as_json(row: AuditRow) -> dict[str, object]:
    """A stored record as `GET /admin/audit` and the export show it."""
    return {
        "id": row.id,
        "time": _aware(row.time).isoformat(),
        "trace_id": row.trace_id,
        "subject": row.subject,
        "tenant": row.tenant,
        "route": row.route,
        "status": row.status,
        "policy_version": row.policy_version,
        "index_generation": row.index_generation,
        "doc_ids": json.loads(row.doc_ids_json),
        "chunk_ids": json.loads(row.chunk_ids_json),
        "degraded": json.loads(row.degraded_json),
        "abstain_reason": row.abstain_reason,
        "duration_ms": row.duration_ms,
    }


class AuditTrail:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def reachable(self) -> bool:
        """Whether the database answers at all."""
        try:
            with self.engine.connect() as connection:
                connection.execute(text("SELECT 1"))
        except Exception:
            return False
        return True

    def write(self, records: Sequence[AuditRecord]) -> None:
        """One transaction for the batch: all recorded, or none."""
        if records:
            with self.engine.begin() as connection:
                connection.execute(insert(AuditRow), [r.row() for r in records])

    def find(
        self,
        tenant: str,
        *,
        subject: str | None = None,
        doc_id: str | None = None,
        since: dt.datetime | None = None,
        until: dt.datetime | None = None,
        before: int | None = None,
        limit: int = 100,
    ) -> list[AuditRow]:
        """The tenant's records, newest recorded first; `before` continues a page."""
        query = select(AuditRow).where(col(AuditRow.tenant) == tenant)
        if subject is not None:
            query = query.where(col(AuditRow.subject) == subject)
        if doc_id is not None:  # the ID as JSON writes it, quotes included
            query = query.where(col(AuditRow.doc_ids_json).contains(json.dumps(doc_id)))
        if since is not None:
            query = query.where(col(AuditRow.time) >= since)
        if until is not None:
            query = query.where(col(AuditRow.time) < until)
        if before is not None:
            query = query.where(col(AuditRow.id) < before)
        with Session(self.engine) as s:
            return list(s.exec(query.order_by(col(AuditRow.id).desc()).limit(limit)).all())

    def export(self, tenant: str, since: dt.datetime | None = None) -> Iterator[AuditRow]:
        """Every record of the tenant in the order recorded, read a page at a time."""
        after = 0
        while True:
            query = select(AuditRow).where(col(AuditRow.tenant) == tenant, col(AuditRow.id) > after)
            if since is not None:
                query = query.where(col(AuditRow.time) >= since)
            with Session(self.engine) as s:
                page = list(s.exec(query.order_by(col(AuditRow.id)).limit(1000)).all())
            yield from page
            if len(page) < 1000:
                return
            after = page[-1].id or after

    def purge(self, older_than: dt.datetime) -> int:
        """Delete records from before `older_than`; how many went."""
        with Session(self.engine) as s:
            result = s.exec(delete(AuditRow).where(col(AuditRow.time) < older_than))
            s.commit()
            return int(result.rowcount or 0)


def _aware(moment: dt.datetime) -> dt.datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)  # SQLite drops it
