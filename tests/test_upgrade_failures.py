"""Upgrades that do not go to plan: `gateway db upgrade` killed half-way on SQLite leaves the
catalog as it was and runs again; a catalog a newer release wrote (a rollback) is named as
such by every command instead of being sent to `gateway db upgrade`; the writer says why it
stops in one line, as every other command does; and an SQLite error that is no outage is
not reported as one."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from gateway.errors import GatewayError
from gateway.storage import schema
from gateway.storage.catalog import open_engine
from gateway.storage.layout import DataLayout
from tests.helpers.postgres import Cluster
from tests.helpers.processes import gateway_env, run_gateway

# The real `gateway db upgrade`, killed with SIGKILL (as kill -9 or a power cut would) just
# before migration 0010's first statement, when 0009 has added `generations.precisions`.
KILLED_AS_0010_BEGINS = """
import os, runpy, signal, sys
from sqlalchemy import Engine, event

@event.listens_for(Engine, "before_cursor_execute")
def _kill(connection, cursor, statement, *args):
    if statement.lstrip().startswith("CREATE TABLE directory_users"):
        os.kill(os.getpid(), signal.SIGKILL)

sys.argv = ["gateway", "db", "upgrade", "--data-dir", sys.argv[1]]
runpy.run_module("gateway", run_name="__main__")
"""


def catalog_at(root: Path, revision: str) -> DataLayout:
    layout = DataLayout(root)
    root.mkdir(parents=True)
    schema.upgrade(open_engine(layout.catalog), revision)
    return layout


def columns(layout: DataLayout, table: str) -> set[str]:
    with sqlite3.connect(layout.catalog) as db:
        return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def stamped(layout: DataLayout) -> str:
    with sqlite3.connect(layout.catalog) as db:
        return str(db.execute("SELECT version_num FROM alembic_version").fetchone()[0])


@pytest.mark.server
def test_an_upgrade_killed_half_way_leaves_the_catalog_as_it_was_and_runs_again(
    tmp_path: Path,
) -> None:
    """pysqlite committed each CREATE and ALTER TABLE by itself: killed in 0010, the
    catalog stayed at 0008 with 0009's column added, and every rerun failed on it."""
    layout = catalog_at(tmp_path / "data", "0008")
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AS_0010_BEGINS, str(layout.root)],
        env=gateway_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr  # it got as far as 0010

    assert stamped(layout) == "0008"
    assert "precisions" not in columns(layout, "generations")  # 0009 is undone with it
    with pytest.raises(GatewayError) as refused:
        layout.open_catalog()
    assert refused.value.code == "catalog_outdated" and "gateway db upgrade" in refused.value.detail

    again = run_gateway("db", "upgrade", "--data-dir", str(layout.root), env=gateway_env())
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"catalog schema upgraded: 0008 -> {schema.head()}"
    assert "precisions" in columns(layout, "generations")


NEWER = (
    "catalog_outdated: the catalog was written by a newer release (revision 9999); this "
    f"release reads up to {schema.head()}: restore the backup taken before the upgrade, or "
    "run the newer release"
)


@pytest.mark.server
@pytest.mark.parametrize(
    "command", [("db", "upgrade"), ("worker",), ("keys", "list")], ids=" ".join
)
def test_a_catalog_of_a_newer_release_is_named_so_by_every_command(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """After a rollback, `gateway db upgrade` was recommended and then failed with a
    100-line traceback; nothing here leads back from a revision this release lacks."""
    layout = catalog_at(tmp_path / "data", "head")
    with sqlite3.connect(layout.catalog) as db:
        db.execute("UPDATE alembic_version SET version_num = '9999'")
    result = run_gateway(*command, env=gateway_env(GATEWAY_DATA_DIR=str(layout.root)))
    assert result.returncode == 1
    assert result.stderr.strip().endswith(NEWER)
    assert "Traceback" not in result.stderr
    assert stamped(layout) == "9999"  # left for the newer release, or the backup


@pytest.mark.server
def test_a_catalog_of_a_newer_release_is_named_so_on_postgres(
    tmp_path: Path, postgres: Cluster
) -> None:
    url = postgres.new_database()
    schema.upgrade(open_engine(url))
    with psycopg.connect(url.replace("+psycopg", "")) as db:
        db.execute("UPDATE alembic_version SET version_num = '9999'")
    env = gateway_env(GATEWAY_DATA_DIR=str(tmp_path), GATEWAY_DATABASE_URL=url)
    result = run_gateway("db", "upgrade", env=env)
    assert result.returncode == 1
    assert result.stderr.strip() == NEWER


@pytest.mark.server
def test_the_writer_on_an_out_of_date_catalog_says_why_in_one_line(tmp_path: Path) -> None:
    """It died with a 46-line traceback whose message was withheld."""
    layout = catalog_at(tmp_path / "data", "0008")
    result = run_gateway("worker", env=gateway_env(GATEWAY_DATA_DIR=str(layout.root)))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"catalog_outdated: the catalog's schema is at revision 0008, this release needs "
        f"{schema.head()}: {schema.UPGRADE_HINT}"
    )
    assert "Traceback" not in result.stderr


@pytest.mark.server
def test_an_sqlite_error_that_is_no_outage_is_not_reported_as_one(tmp_path: Path) -> None:
    """A catalog an interrupted upgrade of an earlier build left behind (at 0008, 0009's
    column added): `gateway db upgrade` was told `catalog_unavailable ... retry shortly`
    for ever; now it fails naming the database's own error (its fixed name: the message
    stays out, as every exception's does)."""
    layout = catalog_at(tmp_path / "data", "0008")
    with sqlite3.connect(layout.catalog) as db:
        db.execute("ALTER TABLE generations ADD COLUMN precisions VARCHAR")
    result = run_gateway("db", "upgrade", "--data-dir", str(layout.root), env=gateway_env())
    assert result.returncode == 1
    assert "catalog_unavailable" not in result.stderr
    assert result.stderr == "the catalog database refused the command (SQLITE_ERROR)\n"


def test_sqlite_held_locked_is_still_an_outage(tmp_path: Path) -> None:
    catalog = DataLayout(tmp_path / "data").open_catalog()
    holder = sqlite3.connect(catalog.engine.url.database or "", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer, holding the lock
    try:
        with catalog.engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA busy_timeout=0")  # refused now, not in 10 s
            with pytest.raises(GatewayError) as away:
                connection.execute(text("DELETE FROM documents"))
            assert away.value.code == "catalog_unavailable"
            with pytest.raises(OperationalError):  # a fault of the statement: as it is
                connection.execute(text("SELECT * FROM no_such_table"))
    finally:
        holder.close()
