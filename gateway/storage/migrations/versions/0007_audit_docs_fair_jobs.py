"""The audit trail's document index, the write routes' facts, and the size of queued jobs.

`audit_docs` holds one row per (record, document ID), indexed by (tenant, doc_id, record),
so `GET /admin/audit?doc_id=` is an index lookup instead of a LIKE over every record's
JSON; existing records are indexed here (a large trail takes a while: once). `audit` gains
`versions_json` and `job_id` (the write routes' versions and job); `jobs` gains
`size_bytes`, the queued work a tenant's quota counts.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# Each record's doc IDs, from the JSON array it keeps them in (every ID once per record).
_BACKFILL = {
    "sqlite": (
        "INSERT OR IGNORE INTO audit_docs (audit_id, doc_id, tenant, time) "
        "SELECT a.id, j.value, a.tenant, a.time FROM audit AS a, json_each(a.doc_ids_json) AS j"
    ),
    "postgresql": (
        "INSERT INTO audit_docs (audit_id, doc_id, tenant, time) "
        "SELECT a.id, j.value, a.tenant, a.time FROM audit AS a "
        "CROSS JOIN LATERAL jsonb_array_elements_text(a.doc_ids_json::jsonb) AS j(value) "
        "ON CONFLICT DO NOTHING"
    ),
}


def upgrade() -> None:
    op.create_table(
        "audit_docs",
        sa.Column("audit_id", sa.Integer(), primary_key=True),
        sa.Column("doc_id", sa.String(), primary_key=True),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_audit_docs_lookup", "audit_docs", ["tenant", "doc_id", "audit_id"])
    op.create_index("ix_audit_docs_time", "audit_docs", ["time"])
    with op.batch_alter_table("audit") as audit:
        audit.add_column(
            sa.Column("versions_json", sa.String(), nullable=False, server_default="[]")
        )
        audit.add_column(sa.Column("job_id", sa.String(), nullable=True))
    with op.batch_alter_table("jobs") as jobs:
        jobs.add_column(sa.Column("size_bytes", sa.Integer(), nullable=False, server_default="0"))
    op.execute(_BACKFILL[op.get_bind().dialect.name])
