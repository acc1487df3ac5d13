"""Erasure requests: deletes whose text, titles and vectors are still to be erased from
every file and object, and how far each erasure got (gateway/storage/erasures.py).

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "erasures",
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("tenant", sa.String(), nullable=False),
        sa.Column("reason", sa.String(), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("report_json", sa.String(), nullable=False),
    )
    op.create_index("ix_erasures_status", "erasures", ["status"])


def downgrade() -> None:
    op.drop_index("ix_erasures_status", table_name="erasures")
    op.drop_table("erasures")
