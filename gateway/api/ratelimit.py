"""Request rates per subject and per tenant, from the policy's `limits` (token buckets).

A caller's request takes one token from its own bucket and one from its tenant's; a bucket
holds at most `burst` tokens and refills at `rate_per_s`. Without a token the request is
429 `rate_limited` with `Retry-After`, before it costs anything else. Buckets live in the
server: in its process (`RateLimiter`), or in one SQLite file all the processes of a
`gateway serve --processes N` share (`SharedRateLimiter`, gateway/api/processes.py), so
the number of processes changes nothing a caller sees. A deployment of N replicas admits
up to N times the rate in total (divide the policy's rates by N to bound the deployment).
Absent limits mean unlimited.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gateway.domain import Caller
from gateway.errors import GatewayError
from gateway.policy.model import Limits, Rate

MAX_BUCKETS = 100_000  # the least recently used go first: memory stays bounded


@dataclass
class _Bucket:
    tokens: float
    at: float


def _checks(caller: Caller, limits: Limits) -> list[tuple[tuple[str, str], Rate]]:
    """The buckets a request of `caller` takes a token from, with their rates."""
    wanted = [
        (("subject", caller.cache_scope), limits.per_subject),
        (("tenant", caller.tenant), limits.per_tenant),
    ]
    return [(key, rate) for key, rate in wanted if rate is not None]


def _refill(tokens: float, at: float, rate: Rate, now: float) -> float:
    """A bucket's tokens at `now`, from `tokens` at `at`."""
    return min(rate.burst, tokens + max(0.0, now - at) * rate.rate_per_s)


def _refuse_short(levels: list[tuple[float, Rate]]) -> None:
    """429 when any bucket lacks a whole token, with the wait until all have one."""
    short = [(tokens, rate) for tokens, rate in levels if tokens < 1]
    if short:
        wait = max((1 - tokens) / rate.rate_per_s for tokens, rate in short)
        retry_after = max(1, math.ceil(wait))
        raise GatewayError(
            "rate_limited",
            f"over the policy's request rate; retry in {retry_after} s",
            headers={"Retry-After": str(retry_after)},
        )


class RateLimiter:
    def __init__(self) -> None:
        self._buckets: OrderedDict[tuple[str, str], _Bucket] = OrderedDict()
        self._lock = threading.Lock()

    def admit(self, caller: Caller, limits: Limits) -> None:
        """Take a token for the caller and its tenant, or raise 429 `rate_limited`."""
        checks = _checks(caller, limits)
        if not checks:
            return
        now = time.monotonic()
        with self._lock:
            buckets = [(self._refilled(key, rate, now), rate) for key, rate in checks]
            _refuse_short([(bucket.tokens, rate) for bucket, rate in buckets])
            for bucket, _ in buckets:
                bucket.tokens -= 1

    def _refilled(self, key: tuple[str, str], rate: Rate, now: float) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(rate.burst), now)
            if len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
            bucket.tokens = _refill(bucket.tokens, bucket.at, rate, now)
            bucket.at = now
        return bucket


class SharedRateLimiter:
    """The same buckets in an SQLite file that every process of one server opens: a
    request takes its tokens in one write transaction, whichever process serves it.

    The clock is CLOCK_MONOTONIC (`time.monotonic`), one for the whole host. Nothing here
    must survive a crash (the file is the server's own, made at its start), so SQLite does
    not wait for the disk. A transaction takes microseconds; one that cannot have the file
    within LOCK_WAIT_S (the event loop waits meanwhile) is 503 `not_ready`, to be retried,
    never admitted unlimited. A bucket full again is the same as no row: those rows are
    deleted now and then, so the file stays as small as the callers active lately."""

    PRUNE_EVERY = 1000  # admissions between deletions of full buckets
    LOCK_WAIT_S = 0.2

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(
            str(path), timeout=self.LOCK_WAIT_S, isolation_level=None, check_same_thread=False
        )
        with _unavailable_as_not_ready():
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=OFF")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS buckets (kind TEXT, key TEXT, tokens REAL, at REAL, "
                "full_at REAL, PRIMARY KEY (kind, key)) WITHOUT ROWID"
            )
        self._lock = threading.Lock()  # one transaction at a time on this connection
        self._admitted = 0

    def close(self) -> None:
        self._db.close()

    def admit(self, caller: Caller, limits: Limits) -> None:
        """Take a token for the caller and its tenant, or raise 429 `rate_limited`."""
        checks = _checks(caller, limits)
        if not checks:
            return
        with self._lock, _unavailable_as_not_ready():
            self._db.execute("BEGIN IMMEDIATE")  # the clock is read once the file is ours
            try:
                self._take(checks, time.monotonic())
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def _take(self, checks: list[tuple[tuple[str, str], Rate]], now: float) -> None:
        levels = []
        for (kind, key), rate in checks:
            row = self._db.execute(
                "SELECT tokens, at FROM buckets WHERE kind = ? AND key = ?", (kind, key)
            ).fetchone()
            tokens = float(rate.burst) if row is None else _refill(row[0], row[1], rate, now)
            levels.append((tokens, rate))
        _refuse_short(levels)
        for ((kind, key), rate), (tokens, _) in zip(checks, levels, strict=True):
            left = tokens - 1
            self._db.execute(
                "INSERT OR REPLACE INTO buckets VALUES (?, ?, ?, ?, ?)",
                (kind, key, left, now, now + (rate.burst - left) / rate.rate_per_s),
            )
        self._admitted += 1
        if self._admitted % self.PRUNE_EVERY == 0:
            self._db.execute("DELETE FROM buckets WHERE full_at < ?", (now,))


@contextmanager
def _unavailable_as_not_ready() -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        raise GatewayError(
            "not_ready",
            "the rate limits shared by this server's processes cannot be read; retry",
            headers={"Retry-After": "1"},
        ) from exc
