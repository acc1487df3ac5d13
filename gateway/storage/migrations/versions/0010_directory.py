"""The directory: users and groups an identity provider provisions by SCIM, per tenant.

`directory_users`, `directory_groups` and `directory_members` hold the resources;
`directory_versions` holds one counter per tenant, raised by every change, and one for the
whole deployment (tenant ''), which `replicas.directory_version` reports as seen by each
serving process, so a change that takes access away is answered once every replica
enforces it (docs/operations.md, "Directory (SCIM)").

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "directory_users",
        sa.Column("tenant", sa.String(), primary_key=True),
        sa.Column("id", sa.String(), primary_key=True),
        sa.Column("user_name", sa.String(), nullable=False),
        sa.Column("user_name_key", sa.String(), nullable=False),  # lower case: caseExact false
        sa.Column("external_id", sa.String(), nullable=True),
        sa.Column("display_name", sa.String(), nullable=True),
        sa.Column("active", sa.Boolean(), nullable=False),
        # A deleted user stays as a tombstone, so its tokens are refused until they expire.
        sa.Column("deleted", sa.Boolean(), nullable=False),
        sa.Column("attributes_json", sa.String(), nullable=False),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("modified", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
    )
    op.create_index(
        "ux_directory_users_name", "directory_users", ["tenant", "user_name_key"], unique=True
    )
    op.create_index("ix_directory_users_external", "directory_users", ["tenant", "external_id"])
    op.create_table(
        "directory_groups",
        sa.Column("tenant", sa.String(), primary_key=True),
        sa.Column("id", sa.String(), primary_key=True),
        sa.Column("display_name", sa.String(), nullable=False),
        sa.Column("external_id", sa.String(), nullable=True),
        sa.Column("created", sa.DateTime(timezone=True), nullable=False),
        sa.Column("modified", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
    )
    op.create_index("ix_directory_groups_name", "directory_groups", ["tenant", "display_name"])
    op.create_table(
        "directory_members",
        sa.Column("tenant", sa.String(), primary_key=True),
        sa.Column("group_id", sa.String(), primary_key=True),
        sa.Column("user_id", sa.String(), primary_key=True),
    )
    op.create_index("ix_directory_members_user", "directory_members", ["tenant", "user_id"])
    versions = op.create_table(
        "directory_versions",
        sa.Column("tenant", sa.String(), primary_key=True),
        sa.Column("version", sa.Integer(), nullable=False),
    )
    # The deployment's counter exists from the start: every change locks and raises it, which
    # also orders concurrent writers on PostgreSQL.
    op.bulk_insert(versions, [{"tenant": "", "version": 0}])
    # Nullable-free with a default: SQLite adds it in place, without copying the table.
    with op.batch_alter_table("replicas") as replicas:
        replicas.add_column(
            sa.Column("directory_version", sa.Integer(), nullable=False, server_default="0")
        )
