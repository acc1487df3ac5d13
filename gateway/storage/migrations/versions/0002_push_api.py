"""The push API: a scope for API keys, and the queue of ingest jobs.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TEXT = sa.String()


def upgrade() -> None:
    # A catalog made between the two changes of this release may have the column already.
    keys = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("api_keys")}
    if "scope" not in keys:
        with op.batch_alter_table("api_keys") as table:
            table.add_column(sa.Column("scope", TEXT, nullable=False, server_default="search"))
    if sa.inspect(op.get_bind()).has_table("jobs"):
        return
    op.create_table(
        "jobs",
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", TEXT, nullable=False, unique=True),
        sa.Column("tenant", TEXT, nullable=False),
        sa.Column("submitted_by", TEXT, nullable=False),
        sa.Column("kind", TEXT, nullable=False),
        sa.Column("status", TEXT, nullable=False),
        sa.Column("documents", sa.Integer(), nullable=False),
        sa.Column("chunks", sa.Integer(), nullable=False),
        sa.Column("unchanged", sa.Integer(), nullable=False),
        sa.Column("index_generation", sa.Integer(), nullable=True),
        sa.Column("errors_json", TEXT, nullable=False),
        sa.Column("records_json", TEXT, nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_index("ix_jobs_tenant", "jobs", ["tenant"])
