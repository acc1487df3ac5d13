"""The directory: when a userName or externalId was given to a user that someone held before
(`user_name_since`, `external_id_since`), so that tokens issued to the former holder are
not taken for the new one; and userName keys that fold ASCII letters only.

`str.lower()` folded letters of other scripts onto ASCII (the Kelvin sign U+212A is "k"),
so "\\u212aim" and "kim" were one user. Every key that was its userName in lower case is
written again with ASCII letters folded alone; a key that is not (a tombstone's name given
up, `RETIRED-...`) stays. No two keys can meet: names equal with ASCII letters folded were
equal lowered too, and the unique index held them apart already.

And `directory_retired_groups`: the displayNames of each tenant's groups deleted or renamed
from now on, which stay the directory's to decide for a token that still lists them.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_BATCH = 500


def upgrade() -> None:
    op.create_table(
        "directory_retired_groups",
        sa.Column("tenant", sa.String(), primary_key=True),
        sa.Column("display_name", sa.String(), primary_key=True),
    )
    # Nullable, no default: SQLite adds them in place, without copying the table.
    with op.batch_alter_table("directory_users") as users:
        users.add_column(sa.Column("user_name_since", sa.DateTime(timezone=True), nullable=True))
        users.add_column(sa.Column("external_id_since", sa.DateTime(timezone=True), nullable=True))
    table = sa.table(
        "directory_users",
        sa.column("tenant", sa.String()),
        sa.column("id", sa.String()),
        sa.column("user_name", sa.String()),
        sa.column("user_name_key", sa.String()),
    )
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(table.c.tenant, table.c.id, table.c.user_name, table.c.user_name_key)
    ).all()
    changed = [
        {"t": tenant, "i": user_id, "k": name.translate(_ASCII_LOWER)}
        for tenant, user_id, name, key in rows
        if key == name.lower() and key != name.translate(_ASCII_LOWER)
    ]
    statement = (
        sa.update(table)
        .where(table.c.tenant == sa.bindparam("t"), table.c.id == sa.bindparam("i"))
        .values(user_name_key=sa.bindparam("k"))
    )
    for start in range(0, len(changed), _BATCH):
        bind.execute(statement, changed[start : start + _BATCH])
