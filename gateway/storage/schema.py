"""The catalog's schema: which migration a database is at, and bringing it to the newest.

Alembic's migrations (`gateway/storage/migrations/versions/`) describe every schema since
documents were identified by tenant, on SQLite and PostgreSQL alike. A database with no
tables is created at the newest revision by whichever process opens it first (so a new
data dir needs no extra step). An existing database is upgraded only by `gateway db
upgrade`: an upgrade is a step the operator takes, never a race between replicas
starting together, and every other command refuses an out-of-date catalog, naming it.
An upgrade is one transaction, on SQLite too: one stopped half-way leaves the catalog as it
was. A revision this release does not know is a newer release's, which no command here
can upgrade or go back from.

Alembic is imported only to migrate: every process checks the revision as it opens the
catalog, and reading one row needs no migration framework (a sixth of a server's imports).
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, event, inspect, text

from gateway.errors import GatewayError

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"
BASELINE = "0001"  # what a catalog made before migrations existed (with tenants) is at
UPGRADE_HINT = "run `gateway db upgrade` (with the same GATEWAY_DATA_DIR or GATEWAY_DATABASE_URL)"
_TABLES = {"documents", "chunks", "generations", "api_keys"}
_VERSION_TABLE = "alembic_version"  # Alembic's default, where it records the revision
_PG_LOCK = 0x6761_7465  # the advisory lock that serialises migrations on PostgreSQL


def head() -> str:
    """The newest revision. The migrations form one line, numbered in their file names
    (tests/test_schema.py holds Alembic's own reading of them to the same answer)."""
    return max(_revisions())


def _revisions() -> set[str]:
    return {p.name[:4] for p in (MIGRATIONS / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")}


def revision_of(connection: Connection) -> str | None:
    """The revision the database is at; None when it has none of the catalog's tables.
    A catalog made before migrations is at the baseline; one made before documents were
    identified by tenant cannot be upgraded (catalog_outdated: ingest again)."""
    tables = _tables(connection)
    if not tables & _TABLES:
        return None
    current = _stamped(connection, tables)
    if current is not None and current not in _revisions():
        # A rollback to this release after a newer one upgraded the catalog: no migration
        # here leads back, and `gateway db upgrade` cannot go forward to it either.
        raise GatewayError(
            "catalog_outdated",
            f"the catalog was written by a newer release (revision {current}); this release "
            f"reads up to {head()}: restore the backup taken before the upgrade, or run the "
            "newer release",
        )
    if current is not None:
        return current
    columns = {c["name"] for c in inspect(connection).get_columns("chunks")}
    if "tenant" not in columns:
        raise GatewayError(
            "catalog_outdated",
            "the catalog predates per-tenant document identity; ingest the documents again "
            "into a fresh data dir (CHANGELOG.md, migration notes)",
        )
    return BASELINE


def _stamped(connection: Connection, tables: set[str]) -> str | None:
    """The revision Alembic recorded (its table holds one row: the migrations are one line)."""
    if _VERSION_TABLE not in tables:
        return None
    return connection.execute(text(f"SELECT version_num FROM {_VERSION_TABLE}")).scalar()


def ensure_current(engine: Engine) -> None:
    """Create an empty database at the newest revision; refuse an out-of-date one."""
    with engine.connect() as connection:
        at = revision_of(connection)
    if at == head():
        return
    if at is not None:
        raise GatewayError(
            "catalog_outdated",
            f"the catalog's schema is at revision {at}, this release needs {head()}: "
            + UPGRADE_HINT,
        )
    with _migrating(engine) as connection:  # another process may have created it meanwhile
        if revision_of(connection) is None:
            _run(connection, "upgrade")


def upgrade(engine: Engine, revision: str = "head") -> tuple[str | None, str]:
    """Bring the database to `revision` (the newest by default): (before, after)."""
    with _migrating(engine) as connection:
        before = revision_of(connection)
        unstamped = _stamped(connection, _tables(connection)) is None
        if before == BASELINE and unstamped:  # made before migrations: record where it is
            _run(connection, "stamp", BASELINE)
        _run(connection, "upgrade", revision)
        after = _stamped(connection, _tables(connection))
        assert after is not None
        return before, after


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names())


def _config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def _run(connection: Connection, what: str, revision: str = "head") -> None:
    from alembic import command

    config = _config()
    config.attributes["connection"] = connection
    getattr(command, what)(config, revision)
    connection.commit()


@contextmanager
def _migrating(engine: Engine) -> Iterator[Connection]:
    """A connection that only one process at a time migrates through."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": _PG_LOCK})
            connection.commit()
            try:
                yield connection
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _PG_LOCK})
                connection.commit()
        return
    database = engine.url.database
    if database in (None, "", ":memory:"):  # another engine would open another database
        with engine.connect() as connection:
            yield connection
        return
    migrating = _one_transaction(engine)
    try:
        with _file_lock(Path(f"{database}.migrate.lock")), migrating.connect() as connection:
            yield connection
    finally:
        migrating.dispose()


def _one_transaction(engine: Engine) -> Engine:
    """An engine on the same SQLite file whose transactions hold DDL too. pysqlite begins a
    transaction only before INSERT, UPDATE or DELETE, so each CREATE or ALTER TABLE before
    one committed by itself: an upgrade killed half-way left a column added under the old
    revision, which no rerun could add again. SQLAlchemy's recipe (SQLite dialect,
    "Enabling Non-Legacy SQLite Transactional Modes"), on this engine only."""
    from gateway.storage.catalog import open_engine  # which imports this module

    migrating = open_engine(engine.url.render_as_string(hide_password=False))

    @event.listens_for(migrating, "connect")
    def _no_pysqlite_transactions(dbapi_connection, _record):  # type: ignore[no-untyped-def]
        dbapi_connection.isolation_level = None

    @event.listens_for(migrating, "begin")
    def _begin(connection):  # type: ignore[no-untyped-def]
        # IMMEDIATE: the write lock is waited for now (busy_timeout), not refused at the
        # first write because a server's audit record committed after this read began.
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return migrating


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
