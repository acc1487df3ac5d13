"""The writer's lease: one writer of ingest jobs per deployment at a time.

With the catalog on PostgreSQL, the lease is a session-level advisory lock held on a
connection of the writer's own: a writer that dies, or whose connection drops, loses it
at once, and a waiting writer (on any host) takes over. With the SQLite catalog (one
host), it is a file lock in the data dir. A writer asks `held()` before each claim and
stops writing the moment the answer is no.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from sqlalchemy import Connection, Engine, text

_PG_KEY = 0x6761_7777  # the advisory lock of the writer (migrations have their own)
_GENERATION_KEY = 0x6761_6767  # held while one generation is written, on any host


@contextmanager
def exclusive(engine: Engine) -> Iterator[None]:
    """Held while a generation is written: writers on every host take turns (two would
    pick the same generation number, and publish over each other's files)."""
    with engine.connect() as connection:
        connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _GENERATION_KEY})
        connection.commit()
        try:
            yield
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _GENERATION_KEY})
            connection.commit()


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
