"""`gateway sync`: the reference connector (gateway/connector/sync.py) as a command."""

from __future__ import annotations

import os
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
        typer.Option(help="The file remembering what was sent (outside FOLDER); see --state-dir."),
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            help="Where state files live, one per folder and URL; "
            "$XDG_STATE_HOME/gateway-sync (~/.local/state/gateway-sync) by default."
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="Print the plan; send nothing.")] = False,
    batch_size: Annotated[int, typer.Option(min=1, max=1000, help="Documents per request.")] = 100,
) -> None:
    """Mirror a folder into the key's tenant through the push API: new and changed files
    are sent, ACL-only changes go through the ACL route, removed files are deleted."""
    import httpx

    from gateway.connector.sync import Connector, StateFile, SyncFailed, plan_sync, state_path
    from gateway.ingest.parse import DocumentsRefused
    from gateway.telemetry.progress import Progress

    if not folder.is_dir():
        fail(f"not a folder: {folder}")
    try:
        key = key_file.read_text().strip()
    except OSError as exc:
        fail(f"cannot read the key file {key_file}: {exc.strerror}")
    url = url.rstrip("/")
    path = state or state_path(state_dir or _default_state_dir(), folder, url)
    if path.resolve().is_relative_to(folder.resolve()):
        fail(f"the state file {path} is inside {folder}: keep it outside the folder it mirrors")
    remembered = StateFile(path, url)
    taken_over = remembered.take_over(folder)
    try:
        plan = plan_sync(folder, remembered.versions, taken_over=taken_over is not None)
    except DocumentsRefused as exc:
        fail(f"refused, nothing was sent:\n{exc}")
    *changes, summary = plan.lines()
    if dry_run:
        typer.echo("\n".join([*changes, summary]))
        return
    if taken_over is not None:
        try:
            remembered.taken_over(taken_over, plan.forgotten)
        except OSError as exc:
            fail(f"cannot take over {taken_over}: {exc.strerror}; nothing was sent")
        typer.echo(
            f"took over {taken_over} as {path} (renamed {taken_over.name}.taken-over); "
            f"{len(plan.forgotten)} versions in it whose files are not in the folder "
            "were forgotten, not deleted",
            err=True,
        )
    for line in changes:
        if line.startswith("! "):  # links out of the folder: named, never read
            typer.echo(line, err=True)
    headers = {"Authorization": f"Bearer {key}"}
    bar = Progress(plan.steps, "sync", "doc")
    try:
        with httpx.Client(base_url=remembered.url, headers=headers, timeout=120) as client, bar:
            connector = Connector(client, remembered, batch_size, bar.update)
            connector.run(plan)
    except SyncFailed as exc:
        fail(f"stopped: {exc} (what was done is remembered; run again to go on)")
    except httpx.HTTPError as exc:
        fail(f"stopped: {type(exc).__name__} talking to {remembered.url} (run again to go on)")
    for label in connector.refused:
        typer.echo(f"not deleted: {label} was not pushed by this key (403 not_owner)", err=True)
    for what in connector.unchanged_acls:  # forgotten: a later run sends the file again
        typer.echo(f"ACL not changed: {what}", err=True)
    deleted = len(plan.delete) - len(connector.refused)
    summary = summary.replace(f"{len(plan.delete)} to delete", f"{deleted} deleted")
    changed = len(plan.acl) - len(connector.unchanged_acls)
    summary = summary.replace(f"{len(plan.acl)} ACL changes", f"{changed} ACL changes")
    typer.echo(summary.replace("to send", "sent"))


def _default_state_dir() -> Path:
    """The XDG base directory for state (not a gateway setting: the user's own)."""
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "gateway-sync"
