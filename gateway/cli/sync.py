"""`gateway sync`: the reference connector (gateway/connector/sync.py) as a command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gateway.cli.options import fail


def sync(
    folder: Annotated[Path, typer.Argument(help="The folder to mirror (searched recursively).")],
    url: Annotated[str, typer.Option(help="The gateway, e.g. https://search.example.com.")],
    key_file: Annotated[
        Path, typer.Option(help="A file holding an ingest API key (gateway keys create).")
    ],
    state: Annotated[
        Path | None,
        typer.Option(help="Where to remember what was sent; FOLDER/.gateway-sync.json."),
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="Print the plan; send nothing.")] = False,
    batch_size: Annotated[int, typer.Option(min=1, max=1000, help="Documents per request.")] = 100,
) -> None:
    """Mirror a folder into the key's tenant through the push API: new and changed files
    are sent, ACL-only changes go through the ACL route, removed files are deleted."""
    import httpx

    from gateway.connector.sync import Connector, StateFile, SyncFailed, plan_sync
    from gateway.ingest.parse import DocumentsRefused
    from gateway.telemetry.progress import Progress

    if not folder.is_dir():
        fail(f"not a folder: {folder}")
    try:
        key = key_file.read_text().strip()
    except OSError as exc:
        fail(f"cannot read the key file {key_file}: {exc.strerror}")
    remembered = StateFile(state or folder / ".gateway-sync.json", url.rstrip("/"))
    try:
        plan = plan_sync(folder, remembered.versions)
    except DocumentsRefused as exc:
        fail(f"refused, nothing was sent:\n{exc}")
    *changes, summary = plan.lines()
    if dry_run:
        typer.echo("\n".join([*changes, summary]))
        return
    headers = {"Authorization": f"Bearer {key}"}
    bar = Progress(plan.steps, "sync", "doc")
    try:
        with httpx.Client(base_url=remembered.url, headers=headers, timeout=120) as client, bar:
            Connector(client, remembered, batch_size, bar.update).run(plan)
    except SyncFailed as exc:
        fail(f"stopped: {exc} (what was done is remembered; run again to go on)")
    except httpx.HTTPError as exc:
        fail(f"stopped: {type(exc).__name__} talking to {remembered.url} (run again to go on)")
    typer.echo(summary.replace("to send", "sent").replace("to delete", "deleted"))
