"""The audit trail's table: one ID-only record per request to a protected route.

Written in batches by `gateway/telemetry/audit.py`, off the request path; read by
`GET /admin/audit` and `gateway audit export`; purged by the writer once older than the
policy's `audit.retention_days`. A record names who asked (subject, tenant), which route
answered with which status, under which policy version and index generation, and which
document and chunk IDs came back, were cited or were changed (with the versions and the
job of a write); never a query, a text or a token.

Each record's document IDs are also rows of `audit_docs`, indexed by (tenant, doc_id,
record), so finding the records of one document reads an index, not every record's JSON.
"""

from __future__ import annotations

import datetime as dt
import json
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from sqlalchemy import Engine, Index, bindparam, insert, text
from sqlmodel import Field, Session, SQLModel, col, delete, select

from gateway.domain import canonical_name

# When `GET /admin/audit` is given no `since`: the records of this long before `until` (or
# now). Every query reads a bounded window of an indexed column, however long the trail.
DEFAULT_WINDOW = dt.timedelta(days=7)


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
    versions_json: str = "[]"  # versions a write route changed, as doc_id@version
    job_id: str | None = None  # the ingest job a push queued
    tool: str | None = None  # the MCP tool a call to /mcp ran


class AuditDocRow(SQLModel, table=True):
    """One document ID of one record: what `doc_id` lookups read."""

    __tablename__ = "audit_docs"
    __table_args__ = (Index("ix_audit_docs_lookup", "tenant", "doc_id", "audit_id"),)
    audit_id: int = Field(primary_key=True)
    doc_id: str = Field(primary_key=True)
    tenant: str
    time: dt.datetime = Field(index=True)  # the record's, so a purge drops both together


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
    versions: tuple[str, ...] = ()
    job_id: str | None = None
    tool: str | None = None

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
            "versions_json": json.dumps(list(self.versions)),
            "job_id": self.job_id,
            "tool": self.tool,
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
        "versions": json.loads(row.versions_json),
        "job_id": row.job_id,
        "tool": row.tool,
    }


# The document rows of just-written records, made by the database from each record's
# `doc_ids_json` (as migration 0007 indexed the records before it): one statement a batch.
# Made in Python, a row at a time, they cost the writer thread 0.8 ms of CPU a record of
# 100 documents, most of it holding the GIL; at `top_k` 100 by document its batches
# delayed the searches running beside them (SciFact p95 23.9-24.2 ms with them against
# 20.7-22.7 without).
_RECORD_DOCUMENTS = {  # each record beside each of its document IDs, `j.value`, by dialect
    "sqlite": "audit AS a, json_each(a.doc_ids_json) AS j",
    "postgresql": "audit AS a CROSS JOIN LATERAL "
    "jsonb_array_elements_text(a.doc_ids_json::jsonb) AS j(value)",
}
_DOC_ROWS = {
    dialect: text(
        "INSERT INTO audit_docs (audit_id, doc_id, tenant, time) "
        f"SELECT DISTINCT a.id, j.value, a.tenant, a.time FROM {pairs} WHERE a.id IN :ids"
    ).bindparams(bindparam("ids", expanding=True))
    for dialect, pairs in _RECORD_DOCUMENTS.items()
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
        """One transaction for the batch, records and their document rows: all recorded,
        or none."""
        if not records:
            return
        with self.engine.begin() as connection:
            ids = (
                connection.execute(
                    insert(AuditRow).returning(col(AuditRow.id), sort_by_parameter_order=True),
                    [r.row() for r in records],
                )
                .scalars()
                .all()
            )  # read whole: SQLite commits no statement left open
            if any(r.doc_ids for r in records):
                connection.execute(_DOC_ROWS[connection.dialect.name], {"ids": ids})

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
        """The tenant's records, newest recorded first; `before` continues a page. A blocking
        call (the routes run it in a thread)."""
        query = select(AuditRow).where(col(AuditRow.tenant) == tenant)
        order = col(AuditRow.id)
        if doc_id is not None:  # through the document index (in record order), not the JSON
            order = col(AuditDocRow.audit_id)
            query = query.join(AuditDocRow, order == col(AuditRow.id)).where(
                col(AuditDocRow.tenant) == tenant, col(AuditDocRow.doc_id) == doc_id
            )
        if subject is not None:
            # Subjects are recorded in NFC, as every door compares names; one an earlier
            # release recorded as its token spelled it (NFC or NFD, as identity providers
            # send names) is found by either spelling too.
            nfc = canonical_name(subject)
            spellings = sorted({subject, nfc, unicodedata.normalize("NFD", nfc)})
            query = query.where(col(AuditRow.subject).in_(spellings))
        if since is not None:
            query = query.where(col(AuditRow.time) >= since)
        if until is not None:
            query = query.where(col(AuditRow.time) < until)
        if before is not None:
            query = query.where(order < before)
        with Session(self.engine) as s:
            return list(s.exec(query.order_by(order.desc()).limit(limit)).all())

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
            s.exec(delete(AuditDocRow).where(col(AuditDocRow.time) < older_than))
            result = s.exec(delete(AuditRow).where(col(AuditRow.time) < older_than))
            s.commit()
            return int(result.rowcount or 0)


def _aware(moment: dt.datetime) -> dt.datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)  # SQLite drops it
