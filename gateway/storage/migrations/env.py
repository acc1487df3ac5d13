"""Alembic's entry point: migrations run on the connection `gateway.storage.schema` gives."""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, render_as_batch=True)  # SQLite alters by copying
with context.begin_transaction():
    context.run_migrations()
