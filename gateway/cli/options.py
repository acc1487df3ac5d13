"""What every `gateway` command shares: settings from the environment, failing clearly."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from gateway.settings import Settings

if TYPE_CHECKING:  # the storage layer loads the database engine: keep `--help` instant
    from gateway.storage.catalog import Catalog
    from gateway.storage.layout import DataLayout

DataDirOption = Annotated[
    Path | None, typer.Option("--data-dir", help="Overrides GATEWAY_DATA_DIR.")
]


def settings_from_env(data_dir: Path | None = None) -> Settings:
    """Settings from the environment; a bad value ends the command with its name and why."""
    try:
        settings = Settings()
    except ValidationError as exc:
        fail(f"invalid settings: {'; '.join(_problem(e) for e in exc.errors())}")
    return settings.model_copy(update={"data_dir": data_dir}) if data_dir else settings


def _problem(error: ErrorDetails) -> str:
    """The setting a problem is about, where it is one setting's, and what is wrong (our
    message as written, without pydantic's "Value error, ")."""
    loc = [str(p) for p in error["loc"]]
    if loc:  # named as it is set: the variable (GATEWAY_JWT_LEEWAY_S), not the field
        field = Settings.model_fields.get(loc[0])
        if field is not None and field.validation_alias is None:
            loc[0] = f"GATEWAY_{loc[0].upper()}"
    where = ".".join(loc)
    message = error["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def layout_of(settings: Settings) -> DataLayout:
    """The data dir, the catalog database and the index store the settings name."""
    from gateway.storage.layout import DataLayout

    return DataLayout.configured(settings)


def catalog_of(settings: Settings, command: str, may_create: bool = False) -> Catalog:
    """The data dir's catalog. Unless `may_create`, only one that exists: a command that
    reads or changes what is there, opened on a mistyped `--data-dir`, made an empty
    catalog there and reported on it (`policy diff --fail-on-widen` said "widens: no",
    exit 0). An unreachable database or an unusable data dir ends the command, named."""
    from gateway.errors import GatewayError

    layout = layout_of(settings)
    sqlite = layout.catalog_url.startswith("sqlite")
    if not may_create and sqlite and not sqlite_file(layout.catalog_url).is_file():
        fail(
            f"{command}: no catalog in {layout.root} (check --data-dir or GATEWAY_DATA_DIR; "
            "`gateway ingest`, `gateway serve` or `gateway db upgrade` makes one)"
        )
    try:
        return layout.open_catalog()
    except GatewayError as exc:
        fail(f"{command}: {exc.code}: {exc.detail}")
    except OSError as exc:
        fail(f"{command}: data dir {layout.root}: {exc.strerror or type(exc).__name__}")


def sqlite_file(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///"))


def fail(message: str) -> NoReturn:
    typer.echo(message, err=True)
    raise typer.Exit(code=1)


def os_error_text(exc: OSError) -> str:
    """What the system said and the paths it names (`No space left on device: data/x`):
    fixed text and the process's own paths, never the text an exception's message may
    quote (docs/security.md, "ID-only traces")."""
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    return f"{exc.strerror}: {' -> '.join(paths)}" if paths else str(exc.strerror)


# How the engines' Rust code words an error of the system inside their own exceptions
# (a ValueError from Tantivy, a RuntimeError from Lance): `Os { code: 28, ... }` or
# `(os error 28)`.
_ENGINE_ERRNO = re.compile(r"Os \{ code: (\d+)|\(os error (\d+)\)")


def engine_os_error(exc: Exception) -> str | None:
    """The system's words for an error of the system that an index engine raised as its
    own exception (a full disk while Tantivy or LanceDB writes); None for any other
    error. Only the errno is read from the message, which is not shown."""
    found = _ENGINE_ERRNO.search(str(exc))
    if found is None:
        return None
    code = int(found.group(1) or found.group(2))
    return f"{os.strerror(code)} (writing or reading the index's files)"


def one_blas_thread() -> None:
    """numpy's BLAS on one thread, for commands that search (`serve`, `demo`, `eval`).

    OpenBLAS keeps a worker that spins for a while after every call it shares. Where a
    request multiplies a few vectors, that worker burned about 20 ms of CPU per /search on
    two cores (server CPU 45 -> 24 ms a request; p50 23.8 -> 19.4 ms), taken from the BM25
    lane and the query encoder, which already run side by side."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


SWITCH_INTERVAL_S = 0.0005  # Python's default is 0.005


def short_gil_turns() -> None:
    """Python's GIL changes hands after 0.5 ms of a thread wanting it, not 5 ms, for
    commands that search (`serve`, `demo`, `eval`).

    A search's threads hand the GIL back many times for a few microseconds each: Tantivy
    reading one stored document (2 us alone, 1.5 ms on average beside a thread running
    Python), a query's search, ONNX Runtime's run. Each time the thread must then wait
    for it while the event loop or another lane runs Python, up to the switch interval.
    On the 200k bench at 8 clients (`measure_hot_path.py`, nine alternated rounds of 400
    searches, 2026-11-28) it was ahead in seven rounds: 83.8-125.0 QPS against
    82.5-120.5; at one client, here and searching SciFact by document, no difference
    beyond the drift."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
