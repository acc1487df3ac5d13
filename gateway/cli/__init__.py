"""The `gateway` command: ingest, serve, demo, eval, bench, and admin and operator tools.

Every command is a plain function in a module of this package, registered here, so the
whole command tree reads in one place. Modules import heavy parts (torch, the engines, the
app) inside the command that needs them: `gateway --help` stays instant.
"""

from __future__ import annotations

import typer

from gateway.cli import (
    audit,
    bench,
    db,
    erase,
    evaluate,
    index,
    keys,
    policy,
    serve,
    sync,
    worker,
)
from gateway.telemetry import exceptions

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__.split("\n")[0])


@app.callback()
def _every_command() -> None:
    # Before any command logs: an exception's message never reaches a log (IDs only).
    exceptions.install()


app.command()(index.ingest)
app.command()(serve.serve)
app.command()(worker.worker)
app.command()(sync.sync)
app.command()(serve.demo)
app.command("eval")(evaluate.evaluate)
app.command()(bench.bench)

policy_app = typer.Typer(no_args_is_help=True, help="Policy tools.")
policy_app.command("check")(policy.policy_check)
policy_app.command("schema")(policy.policy_schema)
policy_app.command("diff")(policy.policy_diff)
app.add_typer(policy_app, name="policy")

keys_app = typer.Typer(no_args_is_help=True, help="API keys for service callers.")
keys_app.command("create")(keys.keys_create)
keys_app.command("list")(keys.keys_list)
keys_app.command("revoke")(keys.keys_revoke)
keys_app.command("adopt")(keys.keys_adopt)
app.add_typer(keys_app, name="keys")

app.command()(index.delete)
acl_app = typer.Typer(no_args_is_help=True, help="Access control lists of indexed documents.")
acl_app.command("set")(index.acl_set)
app.add_typer(acl_app, name="acl")
app.command()(index.reindex)
app.command("erase")(erase.erase)
tenant_app = typer.Typer(no_args_is_help=True, help="Tenants.")
tenant_app.command("delete")(erase.tenant_delete)
app.add_typer(tenant_app, name="tenant")

db_app = typer.Typer(no_args_is_help=True, help="The catalog's database.")
db_app.command("upgrade")(db.db_upgrade)
app.add_typer(db_app, name="db")

audit_app = typer.Typer(help="The audit trail.", no_args_is_help=True)
audit_app.command("export")(audit.audit_export)
app.add_typer(audit_app, name="audit")
