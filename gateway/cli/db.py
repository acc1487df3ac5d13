"""`gateway db upgrade`: bring the catalog's schema to this release, in place."""

from __future__ import annotations

import typer

from gateway.cli.options import DataDirOption, fail, layout_of, settings_from_env
from gateway.errors import GatewayError


def db_upgrade(data_dir: DataDirOption = None) -> None:
    """Apply the catalog's schema migrations (SQLite in the data dir, or the database of
    GATEWAY_DATABASE_URL). Stop writers first; servers may keep serving."""
    from gateway.storage.catalog import open_engine
    from gateway.storage.schema import upgrade

    settings = settings_from_env(data_dir)
    layout = layout_of(settings)
    if not settings.database_url:
        layout.root.mkdir(parents=True, exist_ok=True)
    try:
        before, after = upgrade(open_engine(layout.catalog_url))
    except GatewayError as exc:
        fail(f"{exc.code}: {exc.detail}")
    if before == after:
        typer.echo(f"catalog schema already at revision {after}")
    else:
        typer.echo(f"catalog schema upgraded: {before or 'empty'} -> {after}")
