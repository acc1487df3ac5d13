"""What every `gateway` subcommand shares: settings from the environment, failing clearly."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer
from pydantic import ValidationError

from gateway.settings import Settings

DataDirOption = Annotated[
    Path | None, typer.Option("--data-dir", help="Overrides GATEWAY_DATA_DIR.")
]


def settings_from_env(data_dir: Path | None = None) -> Settings:
    """Settings from the environment; a bad value ends the command with its name and why."""
    try:
        settings = Settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        fail(f"invalid settings: {problems}")
    return settings.model_copy(update={"data_dir": data_dir}) if data_dir else settings


def fail(message: str) -> NoReturn:
    typer.echo(message, err=True)
    raise typer.Exit(code=1)
