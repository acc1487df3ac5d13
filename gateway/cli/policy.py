"""`gateway policy`: check a policy directory, print the policy files' JSON schema."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gateway.cli.options import fail, settings_from_env
from gateway.errors import GatewayError


def policy_check(
    directory: Annotated[Path | None, typer.Argument(help="Policy directory.")] = None,
) -> None:
    """Validate a policy directory; exits non-zero on any problem."""
    from gateway.policy.loader import load_policy

    settings = settings_from_env()
    try:
        loaded = load_policy(directory or settings.policy_dir)
    except GatewayError as exc:
        fail(f"invalid policy: {exc.detail}")
    typer.echo(f"policy ok: version {loaded.version} ({', '.join(loaded.files)})")


def policy_schema() -> None:
    """Print the JSON schema of policy files (checked in as policies/schema.json)."""
    from gateway.policy.loader import policy_schema as render

    typer.echo(render(), nl=False)
