"""`gateway erase` and `gateway tenant delete`: erasure on an operator's demand.

Both run the erasure in this process, under the same writer lock as every writer of
generations, so they also work while `serve` (and its writer) runs: the erasure waits for
a write in progress, and the writer finds the requests done. The report says what was
removed and what is kept (docs/operations.md, "Erasing: `gateway erase`, `gateway tenant delete`").
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gateway.cli.options import DataDirOption, catalog_of, fail, layout_of, settings_from_env
from gateway.errors import GatewayError

if TYPE_CHECKING:
    from gateway.ingest.erasure import ErasureReport
    from gateway.storage.layout import DataLayout

TenantRequired = Annotated[str, typer.Option("--tenant", help="The tenant.")]
WAIT_FOR_REPLICAS_S = 60.0  # how long --wait waits for replicas to serve the erasure


def erase(
    tenant: TenantRequired,
    wait: Annotated[
        bool, typer.Option("--wait", help="Erase now and report; without it, only request.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="The report as JSON.")] = False,
    data_dir: DataDirOption = None,
) -> None:
    """Erase deleted and superseded versions now: their text, titles and vectors from every
    file of the data dir and the object store (replicas follow)."""
    import datetime as dt

    settings = settings_from_env(data_dir)
    layout = layout_of(settings)
    catalog = catalog_of(settings, "erase")
    try:
        catalog.erasures.request(tenant, "operator", due_at=dt.datetime.now(dt.UTC))
        if not wait:
            typer.echo("erasure requested: the writer runs it within a second or so")
            return
        report = _erase_now(layout, settings.policy_dir)
    except GatewayError as exc:
        fail(f"{exc.code}: {exc.detail}")
    _say(report, as_json)


def tenant_delete(
    tenant: TenantRequired,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    data_dir: DataDirOption = None,
) -> None:
    """Remove a tenant: its documents, API keys, jobs and directory entries, then erase
    them. Its audit records (IDs only) follow the audit retention. A tenant with none of
    these is refused (exit 1): a mistyped name must not be reported as deleted."""
    from gateway.ingest.tenants import delete_tenant, holds_tenant

    settings = settings_from_env(data_dir)
    layout = layout_of(settings)
    catalog = catalog_of(settings, "tenant delete")
    try:
        if not holds_tenant(catalog, tenant):
            fail(
                f"tenant delete: no tenant {tenant} in {layout.root}: no documents, API keys, "
                "jobs or directory entries (check --tenant and --data-dir); nothing changed"
            )
        documents, versions, chunks = catalog.tenant_counts(tenant)
        if not yes:
            typer.confirm(
                f"Delete tenant {tenant!r}: {documents} documents ({versions} versions, "
                f"{chunks} chunks), its API keys, jobs and directory entries, and erase "
                "them? This cannot be undone",
                abort=True,
            )
        removed = delete_tenant(layout, tenant)
        typer.echo(
            f"tenant {tenant}: {removed.versions} versions ({removed.chunks} chunks), "
            f"{removed.rows.keys} API keys, {removed.rows.jobs} jobs, "
            f"{removed.rows.directory} directory entries removed"
        )
        report = _erase_now(layout, settings.policy_dir)
    except GatewayError as exc:
        fail(f"{exc.code}: {exc.detail}")
    _say(report, as_json=False)


def _erase_now(layout: DataLayout, policy_dir: Path | None) -> ErasureReport:
    """Run the erasure until done, waiting for replicas up to WAIT_FOR_REPLICAS_S."""
    from gateway.ingest.erasure import erase as run
    from gateway.policy.loader import load_policy

    policy = load_policy(policy_dir).policy
    deadline = time.monotonic() + WAIT_FOR_REPLICAS_S
    while True:
        left = max(0.0, deadline - time.monotonic())
        report = run(layout, ann_min_rows=policy.retrieval.ann_min_rows, wait_s=left)
        if report.done or left <= 0:
            return report


def _say(report: ErasureReport, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(report.as_dict()))
        if not report.done:  # exit 1, as without --json
            raise typer.Exit(code=1)
        return
    # With nothing indexed yet there is no generation to name (only the catalog's WAL).
    nothing_indexed = report.generation is None
    if not report.done:
        written = (
            "erasure not finished (nothing indexed yet)"
            if nothing_indexed
            else f"erasure generation {report.generation} written, older ones not retired yet"
        )
        fail(
            f"{written}, waiting for: {', '.join(report.waiting_for)}; run `gateway erase` "
            "again (the writer also finishes it)"
        )
    through = (
        "(nothing indexed yet)" if nothing_indexed else f"through generation {report.generation}"
    )
    typer.echo(
        f"erased {through}: {report.requests} request(s), "
        f"{report.tenants_rewritten} tenant index(es) rewritten; removed "
        f"{report.files_removed} files ({report.bytes_removed} bytes), "
        f"{report.objects_removed} objects ({report.object_bytes_removed} bytes), "
        f"{len(report.tables_dropped)} vector tables, {report.slices_cleared} handed-over "
        f"slice(s) cleared; {report.seconds:.1f} s"
    )
    typer.echo("kept:")
    for what in report.kept:
        typer.echo(f"  - {what}")
