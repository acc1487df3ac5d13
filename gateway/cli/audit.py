"""`gateway audit export`: a tenant's audit records as JSON lines, in the order recorded."""

from __future__ import annotations

import datetime as dt
import json
from typing import Annotated

import typer

from gateway.cli.options import DataDirOption, catalog_of, fail, settings_from_env
from gateway.errors import GatewayError


def audit_export(
    tenant: Annotated[str, typer.Option(help="The tenant whose records to export.")],
    since: Annotated[
        str | None,
        typer.Option(help="Only records from this day or moment on (ISO 8601; UTC)."),
    ] = None,
    data_dir: DataDirOption = None,
) -> None:
    """Print the tenant's audit records as JSON lines (one record each, as
    `GET /admin/audit` shows them), in the order they were recorded."""
    from gateway.storage.audit import as_json

    start = None
    if since is not None:
        try:
            start = dt.datetime.fromisoformat(since)
        except ValueError:
            fail(f"audit export: --since {since!r} is not a date or time (YYYY-MM-DD)")
        if start.tzinfo is None:
            start = start.replace(tzinfo=dt.UTC)
    catalog = catalog_of(settings_from_env(data_dir), "audit export")
    try:
        for row in catalog.audit.export(tenant, start):
            typer.echo(json.dumps(as_json(row), separators=(",", ":")))
    except GatewayError as exc:
        fail(f"audit export: {exc.code}: {exc.detail}")
