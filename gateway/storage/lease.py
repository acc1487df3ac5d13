"""The writer's lease: one writer of ingest jobs per deployment at a time.

With the catalog on PostgreSQL, the lease is a session-level advisory lock held on a
connection of the writer's own: a writer that dies, or whose connection drops, loses it
at once, and a waiting writer (on any host) takes over. With the SQLite catalog (one
host), it is a file lock in the data dir. A writer asks `held()` before each claim and
stops writing the moment the answer is no.

The generation lock (`exclusive`) is such a lock too, and can be lost the same way while
its connection idles through a write (an idle_session_timeout, a NAT or firewall dropping
an idle connection, pg_terminate_backend): another writer then takes it and builds the
same generation number. So a writer builds in a directory of its own, checks the lock on
its own session before it moves the build into place and publishes it, and commits the
generation on that session (`GenerationLock`; `DataLayout.install_lexical`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from sqlalchemy import Connection, Engine, text

from gateway.errors import GatewayError

log = logging.getLogger("gateway.storage")
_PG_KEY = 0x6761_7777  # the advisory lock of the writer (migrations have their own)
_GENERATION_KEY = 0x6761_6767  # held while one generation is written, on any host


# Whether this session holds the generation lock: a bigint key is (classid, objid) =
# (high, low 32 bits), objsubid 1. Asked of the session itself: one that was cut and
# replaced by a new connection has another pid, and holds nothing.
_HOLDS_GENERATION_LOCK = text(
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'"
    " AND classid::bigint = :high AND objid::bigint = :low AND objsubid = 1"
    " AND granted AND pid = pg_backend_pid())"
)


class GenerationLock:
    """The generation lock on PostgreSQL, held by the session of `connection`.

    A writer that lost it must neither publish nor commit: another writer may be writing
    the same generation number from the same base, and the catalog would name one
    writer's generation while its data dir or the object store holds the other's files.
    So `check` asks the session before the build is moved into place and published
    (`DataLayout.install_lexical`), and the generation is committed on the
    session itself (`Catalog.commit_generation`): a session cut before its COMMIT rolls
    the transaction back, so no writer commits once another can hold the lock."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def check(self, number: int) -> None:
        """Raise `generation_lock_lost` unless this session still holds the lock (and so
        has held it since it was taken: no other writer can have committed since). In the
        transaction the caller opened on `connection`."""
        with self.lost_if_cut(number):
            held = self.connection.execute(
                _HOLDS_GENERATION_LOCK,
                {"high": _GENERATION_KEY >> 32, "low": _GENERATION_KEY & 0xFFFF_FFFF},
            ).scalar()
        if not held:
            raise generation_lock_lost(number)

    @contextmanager
    def lost_if_cut(self, number: int) -> Iterator[None]:
        """Statements on the lock's session: that session cut is the lock lost."""
        try:
            yield
        except GatewayError as exc:
            if self.connection.invalidated:
                raise generation_lock_lost(number) from exc
            raise


def generation_lock_lost(number: int) -> GatewayError:
    """The writer no longer holds the generation lock: transient, so a worker queues the
    jobs again and a caller retries."""
    return GatewayError(
        "catalog_unavailable",
        f"the generation lock was lost before generation {number} was committed (its "
        "connection to the catalog database was cut; another writer may be writing that "
        "generation): nothing of this write was committed; retry it",
    )


@contextmanager
def exclusive(engine: Engine) -> Iterator[GenerationLock]:
    """Held while a generation is written: writers on every host take turns (two would
    pick the same generation number, and publish over each other's files). The writer
    checks what it yields before it moves a build into place, and commits the generation
    on it."""
    with engine.connect() as connection:
        connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _GENERATION_KEY})
        connection.commit()
        try:
            yield GenerationLock(connection)
        finally:
            _unlock(connection)


def _unlock(connection: Connection) -> None:
    """Release the generation lock. A session that ended (cut) released it with itself:
    then the write, committed or not, is not failed for it, and only a warning is left."""
    try:
        released = connection.execute(
            text("SELECT pg_advisory_unlock(:k)"), {"k": _GENERATION_KEY}
        ).scalar()
        connection.commit()
    except Exception as exc:  # the connection is gone, and the lock with it
        # Closed, not returned to the pool: a session still alive would keep the lock there.
        connection.invalidate()
        log.warning("generation lock not released (%s): its session had ended", type(exc).__name__)
        return
    if not released:  # a new session behind the same connection: it held nothing
        log.warning("generation lock not released: its session had ended")


class WriterLease:
    def __init__(self, engine: Engine, data_dir: Path) -> None:
        self._engine, self._data_dir = engine, data_dir
        self._connection: Connection | None = None
        self._file: IO[str] | None = None

    def try_acquire(self) -> bool:
        """Take the lease if it is free; never waits."""
        if self._engine.dialect.name == "postgresql":
            connection = self._engine.connect()
            taken = connection.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": _PG_KEY})
            if taken.scalar():
                connection.commit()
                self._connection = connection
                return True
            connection.close()
            return False
        self._data_dir.mkdir(parents=True, exist_ok=True)
        handle = open(self._data_dir / ".worker.lock", "w")  # noqa: SIM115 (held for life)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        self._file = handle
        return True

    def held(self) -> bool:
        """Whether the lease is still this writer's (its connection is alive)."""
        if self._file is not None:
            return True
        if self._connection is None:
            return False
        try:
            self._connection.execute(text("SELECT 1")).scalar()
            self._connection.commit()
            return True
        except Exception:  # the connection is gone, and the lock with it
            self.release()
            return False

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the file drops the lock
            self._file = None
        if self._connection is not None:
            with contextlib.suppress(Exception):  # already broken, perhaps
                self._connection.close()  # ends the session: the lock goes with it
            self._connection = None
