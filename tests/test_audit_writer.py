"""The audit writer against a real SQLite catalog, with outages and slowness simulated
around the real trail: it recovers under steady traffic, drops only the records it says
it dropped, and spaces its retries however many requests wake it."""

from __future__ import annotations

import asyncio
import datetime as dt
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

import gateway.telemetry.audit as audit_module
from gateway.storage.audit import AuditRecord, AuditTrail
from gateway.storage.layout import DataLayout
from gateway.telemetry.audit import AuditLog
from gateway.telemetry.metrics import Metrics


def record(subject: str, route: str = "/documents/{doc_id}") -> AuditRecord:
    return AuditRecord(dt.datetime.now(dt.UTC), "acme", subject, route, 200, 1.0)


def written(layout: DataLayout) -> list[str]:
    """The subjects the database holds, in the order written."""
    with sqlite3.connect(layout.catalog) as db:
        return [row[0] for row in db.execute("SELECT subject FROM audit ORDER BY id")]


def dropped(metrics: Metrics) -> float:
    counted = metrics.registry.get_sample_value(
        "gateway_audit_records_total", {"outcome": "dropped"}
    )
    return counted or 0.0


class Trail(AuditTrail):
    """The real trail, with an outage (`down`) and a held write (`hold`) to switch on."""

    def __init__(self, layout: DataLayout) -> None:
        super().__init__(layout.open_catalog().engine)
        self.down = threading.Event()
        self.refused = threading.Event()  # set by each refused write
        self.hold = threading.Event()  # while set, a write waits for `release` first
        self.holding, self.release = threading.Event(), threading.Event()
        self.fail_after_hold = False

    def write(self, records: Sequence[AuditRecord]) -> None:
        if self.hold.is_set():
            self.holding.set()
            assert self.release.wait(10)
            if self.fail_after_hold:
                self.refused.set()
                raise RuntimeError("the database went away during the write")
        if self.down.is_set():
            self.refused.set()
            raise RuntimeError("the database refuses records")
        super().write(records)


@pytest.fixture
def layout(tmp_path: Path) -> DataLayout:
    return DataLayout(tmp_path / "data")


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def trail(layout: DataLayout) -> Trail:
    return Trail(layout)


@pytest.fixture
def audit_log(trail: Trail, metrics: Metrics) -> Iterator[AuditLog]:
    log = AuditLog(trail, metrics)
    try:
        yield log
    finally:
        trail.down.clear()
        trail.hold.clear()
        trail.release.set()
        log.close()


def test_required_routes_are_served_again_while_steady_traffic_keeps_a_backlog(
    layout: DataLayout,
) -> None:
    """After an outage, a request to a route that is not required finishes during every
    write, so the queue is never empty: the first batch written ends the refusal, and a
    flush (what /readyz runs) ends instead of chasing the traffic."""
    traffic = threading.Event()
    sent = ["before"]

    class Busy(Trail):
        def write(self, records: Sequence[AuditRecord]) -> None:
            super().write(records)
            if traffic.is_set() and len(sent) < 20_000:  # bounded: the old writer never ends
                sent.append(f"during-{len(sent)}")
                log.add(record(sent[-1]))

    busy = Busy(layout)
    busy.down.set()
    log = AuditLog(busy, Metrics())
    try:
        log.add(record("before"))
        assert not asyncio.run(log.settled(timeout_s=5))  # the outage: /search refused
        traffic.set()
        busy.down.clear()  # the database is back; the traffic goes on

        assert asyncio.run(log.settled(timeout_s=2))  # a request to /search is served
        assert not log.failing
        flushed = threading.Event()

        def readyz() -> None:
            log.flush()
            flushed.set()

        threading.Thread(target=readyz, daemon=True).start()
        assert flushed.wait(2), "/readyz's flush did not end while the traffic went on"
    finally:
        traffic.clear()
        log.close()
    assert written(layout) == sent  # every record, in order, none dropped


def full_while_refused(trail: Trail, audit_log: AuditLog, monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue of 10 (batches of 5) filled with s0..s9 while the database refuses them."""
    monkeypatch.setattr(audit_module, "CAPACITY", 10)
    monkeypatch.setattr(audit_module, "BATCH", 5)
    trail.down.set()
    for i in range(10):
        audit_log.add(record(f"s{i}"))
    assert trail.refused.wait(5)


def test_records_added_at_capacity_during_a_write_drop_waiting_ones_not_those_written(
    layout: DataLayout,
    trail: Trail,
    audit_log: AuditLog,
    metrics: Metrics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    full_while_refused(trail, audit_log, monkeypatch)
    trail.hold.set()  # the next write, of s0..s4, waits while requests come
    trail.down.clear()
    assert trail.holding.wait(5)
    for i in range(10, 13):  # room: the batch being written is out of the queue
        audit_log.add(record(f"s{i}"))
    trail.hold.clear()
    trail.release.set()
    audit_log.close()
    assert written(layout) == [f"s{i}" for i in range(13)]
    assert dropped(metrics) == 0


def test_a_batch_refused_mid_write_goes_back_and_only_the_oldest_are_dropped(
    layout: DataLayout,
    trail: Trail,
    audit_log: AuditLog,
    metrics: Metrics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    full_while_refused(trail, audit_log, monkeypatch)
    trail.fail_after_hold = True  # the next write, of s0..s4, waits and then fails
    trail.hold.set()
    assert trail.holding.wait(5)
    for i in range(10, 13):
        audit_log.add(record(f"s{i}"))
    trail.refused.clear()
    trail.hold.clear()
    trail.release.set()
    assert trail.refused.wait(5)
    trail.down.clear()
    audit_log.close()  # the database takes records again: the close writes what waits
    # s0..s4 went back to the front; 13 records for 10 places: the 3 oldest dropped.
    assert written(layout) == [f"s{i}" for i in range(3, 13)]
    assert dropped(metrics) == 3


def test_a_slow_database_refuses_required_routes_before_any_record_is_dropped(
    layout: DataLayout,
    trail: Trail,
    audit_log: AuditLog,
    metrics: Metrics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(audit_module, "CAPACITY", 10)
    trail.hold.set()  # the database is slow: the write of `first` takes until released
    audit_log.add(record("first"))
    assert trail.holding.wait(5)
    for i in range(8):
        audit_log.add(record(f"r{i}"))
    assert not audit_log.refusing  # 8 of 10 places taken: required routes still served
    audit_log.add(record("r8"))
    assert audit_log.refusing and not audit_log.failing  # 9: refused, nothing dropped yet
    assert not asyncio.run(audit_log.settled(timeout_s=0.05))
    trail.hold.clear()
    trail.release.set()
    assert asyncio.run(audit_log.settled(timeout_s=2))  # served again once it catches up
    audit_log.close()
    assert written(layout) == ["first", *(f"r{i}" for i in range(9))]
    assert dropped(metrics) == 0


@pytest.mark.sleeps
def test_requests_waiting_during_an_outage_cost_the_database_few_tries(
    layout: DataLayout,
) -> None:
    tries = 0

    class Refusing(AuditTrail):
        """A database that refuses every record, counting the tries."""

        def write(self, records: Sequence[AuditRecord]) -> None:
            nonlocal tries
            tries += 1
            raise RuntimeError("the database refuses records")

        def reachable(self) -> bool:
            return True

    log = AuditLog(Refusing(layout.open_catalog().engine), Metrics())
    try:
        log.add(record("alice", "/search"))

        async def requests(seconds: float) -> None:
            """Twenty callers asking again and again, as refused requests would."""

            async def caller() -> None:
                deadline = asyncio.get_running_loop().time() + seconds
                while asyncio.get_running_loop().time() < deadline:
                    assert not await log.settled(timeout_s=0.05)

            await asyncio.gather(*(caller() for _ in range(20)))

        asyncio.run(requests(0.1))  # into the outage
        before = tries
        asyncio.run(requests(0.6))
        # One try per RETRY_GAP_S (0.1 s), whatever the number of requests waking it.
        assert tries - before <= 8
    finally:
        log.close()
