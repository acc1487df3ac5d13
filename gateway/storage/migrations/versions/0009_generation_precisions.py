"""The numerics a generation's passage vectors were embedded in.

`generations.precisions` lists them, comma-separated (`float32`, `bfloat16`,
`cuda:bfloat16`): a generation that adds vectors to the served ones holds both kinds.
Every generation written before this revision was embedded in float32, which the
default records.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("generations") as generations:
        generations.add_column(
            sa.Column("precisions", sa.String(), nullable=False, server_default="float32")
        )
