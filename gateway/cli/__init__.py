"""The `gateway` command: ingest, serve, demo, eval, bench, and admin and operator tools.

Every command is a plain function in a module of this package, registered here, so the
whole command tree reads in one place. Modules import heavy parts (torch, the engines, the
app) inside the command that needs them: `gateway --help` stays instant.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import typer
from typer.core import TyperGroup

from gateway.cli import (
    audit,
    backup,
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
from gateway.cli.options import engine_os_error, fail, os_error_text
from gateway.errors import GatewayError
from gateway.telemetry import exceptions


class _Commands(TyperGroup):
    """The root of the command tree, where any command's expected failure ends it as `fail`
    does: exit 1 with the reason on stderr. A GatewayError (the catalog's database away, a
    disk full under SQLite) or an error of the system (a disk full, a read-only data dir)
    raised where the command does not catch it, or an index engine's error of the system
    (Tantivy and LanceDB raise a full disk as their own ValueError and RuntimeError),
    printed a traceback whose message was withheld, and the operator never learnt why.
    Any other exception is a bug: it keeps its traceback. Typer's and click's own exits,
    Ctrl-C among them, pass as they were."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except GatewayError as exc:
            fail(f"{exc.code}: {exc.detail}" if exc.detail else exc.code)
        except OSError as exc:
            # A broken pipe (`gateway audit export | head`) is click's to end quietly; an
            # OSError without an errno's text is a library's own, not the system's.
            if isinstance(exc, BrokenPipeError) or not exc.strerror:
                raise
            fail(os_error_text(exc))
        except Exception as exc:
            from sqlalchemy.exc import DBAPIError  # here: `gateway --help` stays instant

            if isinstance(exc, ValueError | RuntimeError) and (said := engine_os_error(exc)):
                fail(said)

            # The catalog's SQLite refusing what no outage explains (a file that is not a
            # catalog, a damaged one): its fixed error name, never its message.
            if isinstance(exc, DBAPIError) and isinstance(exc.orig, sqlite3.Error):
                fail(f"the catalog database refused the command ({exc.orig.sqlite_errorname})")
            raise


app = typer.Typer(
    cls=_Commands, no_args_is_help=True, add_completion=False, help=__doc__.split("\n")[0]
)


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
app.command()(backup.backup)

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
