"""`gateway policy`: check a policy directory, print the policy files' JSON schema."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gateway.cli.options import DataDirOption, catalog_of, fail, layout_of, settings_from_env
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


def policy_diff(
    base: Annotated[Path, typer.Argument(help="The policy directory serving now.")],
    new: Annotated[Path, typer.Argument(help="The changed policy directory.")],
    as_of: Annotated[
        str | None, typer.Option("--as-of", help="Decide as of this day (YYYY-MM-DD; UTC today).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document, for tools.")] = False,
    fail_on_widen: Annotated[
        bool,
        typer.Option("--fail-on-widen", help="Exit 1 when any caller gains a document (CI)."),
    ] = False,
    data_dir: DataDirOption = None,
) -> None:
    """Which kinds of caller gain or lose which documents of the catalog if NEW replaces
    BASE, per tenant, decided as the engines decide. IDs and counts only."""
    import datetime as dt
    import json

    from gateway.embedding.model import MODEL_NAME
    from gateway.policy.diff import diff_policies, render_table
    from gateway.policy.loader import load_policy

    try:
        day = dt.date.fromisoformat(as_of) if as_of else dt.datetime.now(dt.UTC).date()
    except ValueError:
        fail(f"policy diff: --as-of {as_of!r} is not a day (YYYY-MM-DD)")
    policies = []
    for name, directory in (("base", base), ("new", new)):
        try:
            policies.append(load_policy(directory))
        except GatewayError as exc:
            fail(f"policy diff: the {name} policy does not load:\n{exc.detail}")
    settings = settings_from_env(data_dir)
    layout, catalog = layout_of(settings), catalog_of(settings, "policy diff")
    try:
        generation = catalog.current_generation()
        if generation is not None and generation.model_name != MODEL_NAME:
            fail(
                f"policy diff: {layout.root} holds an index of {generation.model_name}, "
                f"not of this release's {MODEL_NAME}: it is another deployment's data dir"
            )
        held = catalog.directory.group_names(None)  # the directory's groups count as callers
        diff = diff_policies(
            policies[0], policies[1], catalog.visibilities(), day, directory_groups=held
        )
    except GatewayError as exc:
        fail(f"policy diff: {exc.code}: {exc.detail}")
    typer.echo(json.dumps(diff.as_json(), indent=2) if as_json else render_table(diff))
    if fail_on_widen and diff.widens:
        raise typer.Exit(code=1)
