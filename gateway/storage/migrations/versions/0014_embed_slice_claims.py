"""How many times embedders claimed each handed-over slice (`embed_slices.embedder_claims`),
so that a slice whose embedders keep dying on it (killed for memory, say: no error is
caught, the claim just expires) is left to the writer after a few claims, instead of
being claimed by embedders for ever. Rows of queued jobs start at 0.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("embed_slices") as slices:
        slices.add_column(
            sa.Column("embedder_claims", sa.Integer(), nullable=False, server_default="0")
        )
