"""The handover of embedded slices from `gateway worker --embed-only` processes to the
committing writer (`gateway/storage/slices.py`): one row per slice of a queued or running
ingest job, deleted when the job ends.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "embed_slices",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("job_seq", sa.Integer(), nullable=False),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("keys_json", sa.String(), nullable=False),
        sa.Column("chunking", sa.String(), nullable=False),
        sa.Column("chunks", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(), nullable=False, server_default="open"),
        sa.Column("claimed_by", sa.String(), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("model_name", sa.String(), nullable=True),
        sa.Column("dim", sa.Integer(), nullable=True),
        sa.Column("numerics", sa.String(), nullable=True),
        sa.Column("chunk_ids_json", sa.String(), nullable=True),
        sa.Column("digests", sa.LargeBinary(), nullable=True),
        sa.Column("vectors", sa.LargeBinary(), nullable=True),
        sa.Column("sentence_sizes_json", sa.String(), nullable=True),
        sa.Column("sentence_vectors", sa.LargeBinary(), nullable=True),
        sa.UniqueConstraint("job_id", "ordinal", name="uq_embed_slices_job_ordinal"),
    )
    op.create_index("ix_embed_slices_job_id", "embed_slices", ["job_id"])
    op.create_index("ix_embed_slices_status", "embed_slices", ["status"])
