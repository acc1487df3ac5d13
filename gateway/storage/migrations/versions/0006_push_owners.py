"""Who pushed each document version, and ingest keys limited to a doc_id prefix.

`documents.pushed_by` is the subject (`key:<key id>` for an API key) whose push wrote the
version; NULL for versions written by `gateway ingest` or before this revision, which an
ingest key may change only once an operator hands them to it (`gateway keys adopt`).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable columns without a default: SQLite adds them in place, without copying tables.
    with op.batch_alter_table("documents") as documents:
        documents.add_column(sa.Column("pushed_by", sa.String(), nullable=True))
    with op.batch_alter_table("api_keys") as keys:
        keys.add_column(sa.Column("doc_prefix", sa.String(), nullable=True))
