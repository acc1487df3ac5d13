"""Which version of each tenant's directory is current, asked on every request.

The same cheap check as the served index generation (gateway/storage/current.py): with
SQLite, `PRAGMA data_version` on a connection of its own tells whether anything committed
since the last look, and only then are the versions read again, on that same connection
(microseconds, no engine). With a database server a request takes the versions the
watcher polled at most POLLED_FOR_S ago, and a change that takes access away is answered
only once every replica reports enforcing it (`Replicas`, `directory_version`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import sqlite3
import threading
import time

from sqlalchemy import Engine, select, update

from gateway.errors import GatewayError
from gateway.storage.directory import DEPLOYMENT, Directory
from gateway.storage.replicas import FRESH_S, ReplicaRow, Replicas

log = logging.getLogger("gateway.storage")
POLLED_FOR_S = 1.0  # as long as a polled generation stands (gateway/storage/current.py)


class DirectoryVersions:
    def __init__(self, engine: Engine, directory: Directory, replicas: Replicas) -> None:
        self._directory, self._replicas = directory, replicas
        path = engine.url.database
        on_disk = engine.dialect.name == "sqlite" and path not in (None, "", ":memory:")
        self._raw = (
            sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            if on_disk
            else None
        )
        self._lock = threading.Lock()
        self._seen: tuple[int, dict[str, int]] | None = None  # (data_version, versions)
        self._polled: tuple[float, dict[str, int]] | None = None  # (monotonic, versions)
        self._forgotten = 0  # how many times `forget` was called: polls before it are stale
        self._reported = -1

    @property
    def cheap(self) -> bool:
        return self._raw is not None

    def current(self) -> dict[str, int]:
        """Every tenant's directory version as of now (SQLite) or of the last poll."""
        if self._raw is not None:
            with self._lock:
                data_version = int(self._raw.execute("PRAGMA data_version").fetchone()[0])
                seen = self._seen
                if seen is not None and seen[0] == data_version:
                    return seen[1]
                rows = self._raw.execute("SELECT tenant, version FROM directory_versions")
                versions = {t: int(v) for t, v in rows}
                self._seen = (data_version, versions)
                return versions
        polled = self._polled
        if polled is not None and time.monotonic() - polled[0] <= POLLED_FOR_S:
            return polled[1]
        return self.poll()

    def peek(self) -> dict[str, int] | None:
        """`current` when it costs no query (SQLite's cheap check, or a fresh poll); None
        when a poll is due, which a request on the event loop runs in a thread."""
        if self._raw is not None:
            return self.current()
        polled = self._polled
        if polled is not None and time.monotonic() - polled[0] <= POLLED_FOR_S:
            return polled[1]
        return None

    def poll(self) -> dict[str, int]:
        """The versions as the database has them now; kept for POLLED_FOR_S unless older
        than those kept. Polls run at once (the watcher, requests in threads): one that
        read before another but returned after it would otherwise put the older versions
        back, and a membership removed, and reported enforced, would be granted again for
        up to POLLED_FOR_S. The deployment's counter orders them: every write raises it."""
        with self._lock:
            forgotten = self._forgotten
        started = time.monotonic()  # the versions read are at least as new as this
        versions = self._directory.versions()
        with self._lock:
            kept = self._polled
            newer = kept is None or versions.get(DEPLOYMENT, 0) >= kept[1].get(DEPLOYMENT, 0)
            if forgotten != self._forgotten:
                return versions  # read before this process's own write: never kept
            if newer:
                self._polled = (started, versions)
            elif kept is not None:
                versions = kept[1]  # a later poll returned first: its versions stand
        return versions

    def forget(self) -> None:
        """This process changed the directory: its next request asks the database (and no
        poll that began before the change keeps what it read)."""
        with self._lock:
            self._forgotten += 1
            self._polled = None

    async def watch(self, interval_s: float) -> None:
        """With a database server: poll the versions and report the one enforced here."""
        while self._raw is None:
            await asyncio.sleep(interval_s)
            try:
                versions = await asyncio.to_thread(self.poll)
                seen = versions.get(DEPLOYMENT, 0)
                if seen != self._reported:
                    await asyncio.to_thread(self._report, seen)
            except GatewayError as exc:
                self._polled = None
                log.warning("watching the directory failed (%s); retrying", exc.code)
            except Exception:
                self._polled = None
                log.exception("watching the directory failed; retrying")

    def _report(self, version: int) -> None:
        table = ReplicaRow.__table__  # type: ignore[attr-defined]
        with self._replicas.engine.begin() as c:
            reported = c.execute(
                update(table)
                .where(table.c.replica_id == self._replicas.replica_id)
                .values(directory_version=version)
            )
        if reported.rowcount:  # no row until the replica first reports its generation
            self._reported = version

    def behind(self, version: int) -> list[str]:
        """Labels of the replicas seen recently that enforce an older directory."""
        table = ReplicaRow.__table__  # type: ignore[attr-defined]
        since = time.time() - FRESH_S
        with self._replicas.engine.connect() as c:
            rows = c.execute(
                select(table.c.label, table.c.seen_at).where(table.c.directory_version < version)
            ).all()
        return [label for label, seen in rows if _epoch(seen) >= since]

    async def everywhere(self, version: int, timeout_s: float) -> list[str]:
        """Wait until every replica seen recently enforces `version`; those that do not."""
        if self._raw is not None:
            return []  # every process reads the one file before each request
        deadline = time.monotonic() + timeout_s
        while True:
            behind = await asyncio.to_thread(self.behind, version)
            if not behind or time.monotonic() > deadline:
                return behind
            await asyncio.sleep(0.02)


def _epoch(moment: dt.datetime) -> float:
    aware = moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)
    return aware.timestamp()
