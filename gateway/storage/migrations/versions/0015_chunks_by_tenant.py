"""An index of chunks by (tenant, doc_id, version), so that a request reads the chunks of
its own tenant's versions only. By doc_id alone (`ix_chunks_doc_id`) it read, and threw
away, every tenant's chunks of that doc_id: one tenant's expand stage took longer the more
another tenant held under the same doc_id. A range on the primary key (`chunk_id` from
`<doc_id>@<version>:`) would need no index, but PostgreSQL compares text by the database's
collation, in which ':' and ';' need not be neighbours (ICU's en-US puts ';' first).

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_chunks_tenant_doc_id_version", "chunks", ["tenant", "doc_id", "version"])
