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
            help="Where state files live, one per folder, URL and key; "
            "$XDG_STATE_HOME/gateway-sync (~/.local/state/gateway-sync) by default."
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="Print the plan; send nothing.")] = False,
    batch_size: Annotated[int, typer.Option(min=1, max=1000, help="Documents per request.")] = 100,
    max_request_bytes: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Bytes per request at most: batches are cut to fit, and a document over "
            "it alone is named and not sent (exit 1). By default the gateway's own limit, "
            "33554432 (32 MiB); less for a proxy in front of it that takes less.",
        ),
    ] = None,
    uri_base: Annotated[
        str | None,
        typer.Option(
            help="An http(s) URL where the folder's files can be read, e.g. "
            "https://files.example.com/hr: a document that names no uri gets it joined with "
            "its path in FOLDER. By default its uri is that path (e.g. handbook/travel.md)."
        ),
    ] = None,
    allow_empty: Annotated[
        bool,
        typer.Option(
            help="Delete every document sent before when FOLDER lists none. Without it such "
            "a run is refused (exit 1): a share that is not mounted looks like an empty folder."
        ),
    ] = False,
) -> None:
    """Mirror a folder into the key's tenant through the push API: new and changed files
    are sent, ACL-only changes go through the ACL route, removed files are deleted. A
    folder that lists no document while earlier runs sent some is refused without
    --allow-empty."""
    import httpx

    from gateway.connector.sync import (
        MAX_REQUEST_BYTES,
        Connector,
        FolderEmpty,
        StateFile,
        StateUnreadable,
        SyncFailed,
        plan_sync,
        state_path,
        without_userinfo,
    )
    from gateway.ingest.parse import DocumentsRefused
    from gateway.telemetry.progress import Progress

    if not folder.is_dir():
        fail(f"not a folder: {folder}")
    try:
        key = key_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        fail(f"cannot read the key file {key_file}: {exc.strerror or type(exc).__name__}")
    except UnicodeDecodeError:  # names a byte at most, never the file's content
        fail(f"cannot read the key file {key_file}: not UTF-8 text (an API key is one line)")
    if not key or not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        fail(f"the key file {key_file} holds no API key: one line, the key alone")
    url = url.rstrip("/")
    _check_url(url)
    if uri_base is not None and (
        not uri_base.lower().startswith(("http://", "https://"))
        or without_userinfo(uri_base) != uri_base  # every reader would be shown it
    ):
        fail(
            f"--uri-base must be an http(s) URL without a user name or password, not "
            f"{without_userinfo(uri_base)!r}"
        )
    if max_request_bytes is None:
        max_request_bytes = MAX_REQUEST_BYTES
    path = state or state_path(state_dir or _default_state_dir(), folder, url, key)
    # The state an earlier release kept per folder and URL, read while this key has none
    # and made this key's by the first run that sends (never by a dry run or a refusal):
    # without it, the files removed since the last run would never be deleted.
    earlier = None if state else _earlier_state(state_dir or _default_state_dir(), folder, url)
    if earlier is not None and path.exists():
        earlier = None
    if path.resolve().is_relative_to(folder.resolve()):
        fail(f"the state file {path} is inside {folder}: keep it outside the folder it mirrors")
    try:
        remembered = StateFile(earlier or path, url)
    except StateUnreadable as exc:  # never planned from: it decides the deletes
        fail(
            f"{exc}; nothing was sent. Move it away (or give another --state) to start "
            "afresh: every file is then sent again"
        )
    taken_over = remembered.take_over(folder)
    try:
        plan = plan_sync(
            folder,
            remembered.versions,
            taken_over=taken_over is not None,
            uri_base=uri_base,
            allow_empty=allow_empty,
            max_request_bytes=max_request_bytes,
        )
    except DocumentsRefused as exc:
        fail(f"refused, nothing was sent:\n{exc}")
    except FolderEmpty as exc:  # before --dry-run too: that plan would delete everything
        fail(f"refused: {exc}")
    *changes, summary = plan.lines()
    if dry_run:
        typer.echo("\n".join([*changes, summary]))
        return
    if earlier is not None:
        try:
            earlier.rename(path)
        except OSError as exc:
            fail(f"cannot take over {earlier}: {exc.strerror}; nothing was sent")
        remembered.path = path
        typer.echo(f"took over {earlier} as this key's state ({path})", err=True)
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
        if line.startswith("! "):  # links, named, never read; documents too large to send
            typer.echo(line, err=True)
    headers = {"Authorization": f"Bearer {key}"}
    bar = Progress(plan.steps, "sync", "doc")
    try:
        with httpx.Client(base_url=remembered.url, headers=headers, timeout=120) as client, bar:
            connector = Connector(client, remembered, batch_size, bar.update, max_request_bytes)
            connector.run(plan)
    except SyncFailed as exc:
        fail(f"stopped: {exc} (what was done is remembered; run again to go on)")
    except httpx.HTTPError as exc:
        shown = without_userinfo(remembered.url)
        fail(f"stopped: {type(exc).__name__} talking to {shown} (run again to go on)")
    except OSError as exc:  # the state could not be saved: what it missed is sent again
        fail(f"stopped: cannot save the state file {path}: {exc.strerror or exc}")
    for label in connector.refused:
        typer.echo(f"not deleted: {label} was not pushed by this key (403 not_owner)", err=True)
    for what in connector.unchanged_acls:  # forgotten: a later run sends the file again
        typer.echo(f"ACL not changed: {what}", err=True)
    deleted = len(plan.delete) - len(connector.refused)
    summary = summary.replace(f"{len(plan.delete)} to delete", f"{deleted} deleted")
    changed = len(plan.acl) - len(connector.unchanged_acls)
    summary = summary.replace(f"{len(plan.acl)} ACL changes", f"{changed} ACL changes")
    typer.echo(summary.replace("to send", "sent"))
    if plan.too_large:  # each named above; a later run sends them once they fit
        fail(
            f"{len(plan.too_large)} documents not sent: each makes a request over "
            f"{max_request_bytes} bytes (--max-request-bytes)"
        )


def _check_url(url: str) -> None:
    """Fail unless `url` is an http(s) URL with a host and no user name or password: httpx
    would send those as Basic auth in place of the key, and they must never be shown."""
    import httpx

    from gateway.connector.sync import without_userinfo

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        fail(f"not a URL: {without_userinfo(url)}")
    if parsed.scheme not in ("http", "https") or not parsed.host:
        fail(f"not an http(s) URL with a host: {without_userinfo(url)}")
    if parsed.userinfo:
        fail(
            f"the URL holds a user name or password: give {without_userinfo(url)} without them "
            "(the key file authenticates; they would replace the key)"
        )


def _default_state_dir() -> Path:
    """The XDG base directory for state (not a gateway setting: the user's own)."""
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "gateway-sync"


def _earlier_state(state_dir: Path, folder: Path, url: str) -> Path | None:
    """The state file an earlier release kept for the folder and URL alone, if any."""
    from gateway.connector.sync import state_path

    earlier = state_path(state_dir, folder, url)
    return earlier if earlier.is_file() else None
