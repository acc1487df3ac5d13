"""The MCP tool an audit record's call to /mcp ran.

`audit.tool` names it (search, fetch or answer); NULL for every other route and for records
written before this revision.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A nullable column without a default: SQLite adds it in place, without copying the table.
    with op.batch_alter_table("audit") as audit:
        audit.add_column(sa.Column("tool", sa.String(), nullable=True))
