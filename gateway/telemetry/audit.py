"""The audit trail's writer: the facts of one request's record, and the queue that a
thread writes in batches, off the request path (`gateway/storage/audit.py` stores them;
`gateway/api/audit.py` makes one record per request).

The authentication dependency and the routes add to the current request's `AuditFacts`
(who, under which policy and generation, which IDs came back) with `note` and `note_ids`.
While the database refuses records, `failing` is true: the routes the policy requires a
record for are refused (once the writer's next try, at most a second away, failed too),
and other records wait in the queue until it is full, then the oldest are dropped
(counted in `gateway_audit_records_total{outcome="dropped"}`). The first batch written
again ends the refusal, however many records still wait. Those routes are refused too
while the queue is nearly full because the database is slow (`refusing`): their records
would otherwise push out records already promised.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import ErrorCode
from gateway.placement import pin_this_thread
from gateway.storage.audit import AuditRecord, AuditTrail
from gateway.telemetry.metrics import Metrics

log = logging.getLogger("gateway.audit")
FLUSH_EVERY_S = 0.2  # the longest a record waits before its batch is written
RETRY_WAIT_S = 1.0  # how long a request needing a record waits for a write to succeed
RETRY_GAP_S = 0.1  # during an outage, the least time between two tries of the database
BATCH = 500  # records per transaction
CAPACITY = 50_000  # records kept waiting while the database refuses them


def high_water() -> int:
    """Records waiting from which routes that require a record are refused. Below the
    capacity: requests admitted before the mark was reached still add theirs without
    pushing out another. (Read at each call, so tests may shrink CAPACITY.)"""
    return CAPACITY - CAPACITY // 10


# Slots: `note` sets facts by name, and a misspelt name must raise, not add an attribute
# that no record ever reads.
@dataclass(slots=True)
class AuditFacts:
    """What one request's record says, filled in as the request runs."""

    subject: str | None = None
    tenant: str | None = None
    policy_version: str | None = None
    trace_id: str | None = None
    index_generation: int | None = None
    doc_ids: list[str] = field(default_factory=list)
    chunk_ids: list[str] = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)
    abstain_reason: str | None = None
    versions: list[str] = field(default_factory=list)  # a write's, as doc_id@version
    job_id: str | None = None  # the ingest job a push queued
    tool: str | None = None  # the MCP tool a call to /mcp ran


_facts: contextvars.ContextVar[AuditFacts | None] = contextvars.ContextVar(
    "audit_facts", default=None
)


@contextmanager
def recording() -> Iterator[AuditFacts]:
    """The facts of the request that runs inside."""
    facts = AuditFacts()
    token = _facts.set(facts)
    try:
        yield facts
    finally:
        _facts.reset(token)


def current_facts() -> AuditFacts | None:
    return _facts.get()


@contextmanager
def bound(facts: AuditFacts | None) -> Iterator[None]:
    """Record into `facts` inside, from a task that may not have inherited the request's
    context (the MCP SDK runs tools in tasks of its own); None leaves things as they are."""
    if facts is None:
        yield
        return
    token = _facts.set(facts)
    try:
        yield
    finally:
        _facts.reset(token)


def note(**facts: Any) -> None:
    """Add to the current request's record (nothing outside a request); there, a name
    that is not a field of `AuditFacts` raises AttributeError."""
    current = _facts.get()
    if current is not None:
        for name, value in facts.items():
            setattr(current, name, value)


def note_ids(doc_ids: Iterable[str], chunk_ids: Iterable[str]) -> None:
    """Document and chunk IDs that came back, each once, in order."""
    current = _facts.get()
    if current is not None:
        current.doc_ids = list(dict.fromkeys([*current.doc_ids, *doc_ids]))
        current.chunk_ids = list(dict.fromkeys([*current.chunk_ids, *chunk_ids]))


class AuditLog:
    """Queued records, written by one thread in batches."""

    def __init__(
        self, trail: AuditTrail, metrics: Metrics, cpus: frozenset[int] | None = None
    ) -> None:
        self._trail, self._metrics = trail, metrics
        self._cpus = cpus  # where its thread runs (`placement`); None: anywhere
        self._queue: deque[AuditRecord] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._flushing = threading.Lock()  # the thread and /readyz may both flush
        self._wake = threading.Event()  # write now rather than at the next tick
        self._attempts = 0  # batch writes tried, counted so a request can wait for the next
        self._writing = False  # a batch write is under way
        self._last_try = 0.0  # when the last batch write ended (monotonic)
        self.failing = False  # the last write was refused and records wait
        self.refusal: ErrorCode = "audit_unavailable"  # what required routes answer then
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        return len(self._queue)

    @property
    def refusing(self) -> bool:
        """Whether routes that require a record are refused now: the database refuses
        records, or so many wait (a slow database) that theirs would soon be dropped."""
        return self.failing or len(self._queue) >= high_water()

    def refused(self) -> None:
        """A request was refused because its record could not be kept."""
        self._metrics.audit_refused.inc()

    def add(self, record: AuditRecord) -> None:
        with self._lock:
            self._queue.append(record)
            self._drop_over_capacity()

    def _drop_over_capacity(self) -> None:
        """The oldest records beyond CAPACITY go, counted (the caller holds the lock)."""
        over = len(self._queue) - CAPACITY
        for _ in range(over):
            self._queue.popleft()
        if over > 0:
            self._metrics.audit_records.labels("dropped").inc(over)

    def flush(self) -> bool:
        """Write what waited when called, a batch at a time; False when the database
        refused. Records added meanwhile wait for the next flush: under steady traffic a
        flush that wrote until the queue was empty might never end, and /readyz calls it."""
        with self._flushing:
            with self._lock:
                todo = len(self._queue)
            if todo == 0:  # nothing waits, so nothing is refused
                self.failing = False
                self._attempts += 1  # a look that answers a request waiting in `settled`
                return True
            while todo > 0:
                with self._lock:
                    # Out of the queue before writing: an `add` at capacity meanwhile then
                    # drops the oldest waiting record, never one being written.
                    taken = min(BATCH, todo, len(self._queue))
                    batch = [self._queue.popleft() for _ in range(taken)]
                if not batch:  # adds at capacity dropped the rest
                    break
                todo -= len(batch)
                if not self._write(batch):
                    return False
            return True

    def _write(self, batch: list[AuditRecord]) -> bool:
        """One batch, one transaction; on failure the batch goes back to the queue's front."""
        self._writing = True
        try:
            self._trail.write(batch)
        except Exception as exc:  # the database's error may quote nothing of ours
            if not self.failing:
                log.error("audit records cannot be written (%s); retrying", type(exc).__name__)
            # A database that cannot be reached is the catalog's outage, and said so;
            # one that answers but refuses the records is the audit trail's.
            away = not self._trail.reachable()
            self.refusal = "catalog_unavailable" if away else "audit_unavailable"
            with self._lock:
                # Where they were, oldest first; if adds filled the queue meanwhile, the
                # oldest beyond capacity go, as `add` drops them.
                self._queue.extendleft(reversed(batch))
                self._drop_over_capacity()
            self.failing = True
            self._metrics.audit_failures.inc()
            return False
        else:
            # The database takes records again: required routes are served from now on,
            # though a backlog still waits (steady traffic may keep it from ever emptying).
            if self.failing:
                log.warning("audit records are written again")
            self.failing = False
            self.refusal = "audit_unavailable"
            now = dt.datetime.now(dt.UTC)
            self._metrics.audit_records.labels("written").inc(len(batch))
            for record in batch:
                self._metrics.audit_lag.observe((now - record.time).total_seconds())
            return True
        finally:
            # Counted per batch, after `failing` is set: a request waiting in `settled`
            # learns the outcome of a try, not of a whole flush that may take long.
            self._attempts += 1
            self._writing = False
            self._last_try = time.monotonic()

    async def settled(self, timeout_s: float | None = None) -> bool:
        """While records are refused: wake the writer, wait (without holding a thread) for
        its next try, at most `timeout_s` (RETRY_WAIT_S), and say whether records are
        taken again. A request that needs a record is refused only after that, so the
        first one after the database comes back is served, and during an outage each
        waits about one try, not forever. A try already under way when the request came
        may have begun before the database was back, and its failure says nothing of now:
        then the try after it is waited for."""
        under_way = self._writing  # asked first: a try begun later is a new one
        tried = self._attempts + under_way
        self._wake.set()
        wait_s = RETRY_WAIT_S if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait_s
        while self._attempts <= tried and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return not self.refusing

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def _run(self) -> None:
        # Beside the lanes that are not the dense one: its bursts (a batch of records every
        # FLUSH_EVERY_S) then never take the dense lane's CPU.
        pin_this_thread(self._cpus)
        while not self._stop.is_set():
            self._wake.wait(FLUSH_EVERY_S)
            if self.failing:
                # Each request refused during an outage wakes the writer; however many
                # come, the database gets at most one try per RETRY_GAP_S from here.
                self._stop.wait(max(0.0, self._last_try + RETRY_GAP_S - time.monotonic()))
            self._wake.clear()
            if not self._stop.is_set():
                self.flush()

    def close(self) -> None:
        """Stop the thread and write what waits (once: a refusing database loses it)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=10)
        if not self.flush():
            self._metrics.audit_records.labels("dropped").inc(self.pending)
