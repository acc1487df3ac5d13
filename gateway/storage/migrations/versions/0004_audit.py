"""The audit trail: one ID-only record per request to a protected route.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("subject", sa.String(), nullable=False),
        sa.Column("route", sa.String(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("trace_id", sa.String(), nullable=True),
        sa.Column("policy_version", sa.String(), nullable=True),
        sa.Column("index_generation", sa.Integer(), nullable=True),
        sa.Column("doc_ids_json", sa.String(), nullable=False),
        sa.Column("chunk_ids_json", sa.String(), nullable=False),
        sa.Column("degraded_json", sa.String(), nullable=False),
        sa.Column("abstain_reason", sa.String(), nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=False),
    )
    op.create_index("ix_audit_time", "audit", ["time"])
    op.create_index("ix_audit_tenant", "audit", ["tenant"])
    op.create_index("ix_audit_subject", "audit", ["subject"])
