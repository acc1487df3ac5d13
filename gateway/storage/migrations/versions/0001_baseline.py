"""The catalog as of per-tenant document identity: documents, chunks, generations, keys.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TEXT = sa.String()


def upgrade() -> None:
    op.create_table(
        "documents",
        sa.Column("tenant", TEXT, primary_key=True),
        sa.Column("doc_id", TEXT, primary_key=True),
        sa.Column("version", TEXT, primary_key=True),
        sa.Column("title", TEXT, nullable=False),
        sa.Column("uri", TEXT, nullable=False),
        sa.Column("region", TEXT, nullable=False),
        sa.Column("acl_json", TEXT, nullable=False),
        sa.Column("effective_from", sa.Date(), nullable=False),
        sa.Column("effective_to", sa.Date(), nullable=True),
        sa.Column("closed_by", TEXT, nullable=True),
        sa.Column("content_hash", TEXT, nullable=False),
        sa.Column("source", TEXT, nullable=False),
        sa.Column("text", TEXT, nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
    )
    op.create_index("ix_documents_doc_id", "documents", ["doc_id"])
    op.create_index("ix_documents_generation", "documents", ["generation"])
    op.create_table(
        "chunks",
        sa.Column("tenant", TEXT, primary_key=True),
        sa.Column("chunk_id", TEXT, primary_key=True),
        sa.Column("doc_id", TEXT, nullable=False),
        sa.Column("version", TEXT, nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("text", TEXT, nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.Column("parent", sa.Integer(), nullable=False),
        sa.Column("sentence_vectors", sa.LargeBinary(), nullable=True),
    )
    op.create_index("ix_chunks_doc_id", "chunks", ["doc_id"])
    op.create_table(
        "generations",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lexical_dir", TEXT, nullable=False),
        sa.Column("vector_table", TEXT, nullable=False),
        sa.Column("vector_version", sa.Integer(), nullable=False),
        sa.Column("model_name", TEXT, nullable=False),
        sa.Column("dim", sa.Integer(), nullable=False),
        sa.Column("documents", sa.Integer(), nullable=False),
        sa.Column("chunks", sa.Integer(), nullable=False),
    )
    op.create_table(
        "api_keys",
        sa.Column("key_id", TEXT, primary_key=True),
        sa.Column("secret_hash", TEXT, nullable=False),
        sa.Column("name", TEXT, nullable=False),
        sa.Column("tenant", TEXT, nullable=False),
        sa.Column("region", TEXT, nullable=False),
        sa.Column("principals_json", TEXT, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    )
