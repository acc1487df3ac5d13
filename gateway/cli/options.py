"""What every `gateway` command shares: settings from the environment, failing clearly."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from gateway.settings import Settings

if TYPE_CHECKING:  # the storage layer loads the database engine: keep `--help` instant
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
    where = ".".join(str(p) for p in error["loc"])
    message = error["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def layout_of(settings: Settings) -> DataLayout:
    """The data dir, the catalog database and the index store the settings name."""
    from gateway.storage.layout import DataLayout

    return DataLayout.configured(settings)


def fail(message: str) -> NoReturn:
    typer.echo(message, err=True)
    raise typer.Exit(code=1)


def one_blas_thread() -> None:
    """numpy's BLAS on one thread, for commands that search (`serve`, `demo`, `eval`).

    OpenBLAS keeps a worker that spins for a while after every call it shares. Where a
    request multiplies a few vectors, that worker burned about 20 ms of CPU per /search on
    two cores (server CPU 45 -> 24 ms a request; p50 23.8 -> 19.4 ms), taken from the BM25
    lane and the query encoder, which already run side by side."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")
