"""Ingest jobs' progress: documents and chunks embedded so far, of the chunks planned.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as jobs:
        jobs.add_column(
            sa.Column("documents_done", sa.Integer(), nullable=False, server_default="0")
        )
        jobs.add_column(sa.Column("chunks_done", sa.Integer(), nullable=False, server_default="0"))
        jobs.add_column(sa.Column("chunks_planned", sa.Integer(), nullable=True))
