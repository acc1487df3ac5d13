"""Measure what the audit trail and the metrics cost, and how fast records are written
(issue 19).

On a `gateway bench` data dir (e.g. `gateway bench --chunks 200000 --data-dir D` leaves one):

1. `/search` latency from one client with audit and metrics on (this code, serving D)
   against both off (`--old-tree`: a checkout from before either, e.g.
   `git worktree add /tmp/off 1a068b5`, serving a copy of D whose catalog is set back to
   that code's schema revision `--old-revision`), both servers up, alternated batches;
2. audit records written per second with 8 clients on /search for `--seconds`, and the lag
   from a request's arrival to its record's commit (from `gateway_audit_lag_seconds`:
   mean, and the bucket holding the 95th percentile);
3. the audit table's own write rate, in process: batches of 500 records into SQLite.

Usage: PYTHONPATH=. python scripts/measure_audit.py --data-dir D --old-tree /tmp/off
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

import httpx

from gateway.bench import synthetic
from gateway.bench.load import drive, percentiles
from gateway.bench.server import running_gateway, throwaway_issuer
from gateway.storage.audit import AuditRecord, AuditTrail
from gateway.storage.catalog import open_engine
from gateway.storage.schema import ensure_current

QUESTIONS = [
    f"how must the {team} team {verb} a {thing}"
    for team in ("payroll", "legal", "security", "finance", "support")
    for verb in ("archive", "approve", "review", "encrypt")
    for thing in ("invoice", "contract", "laptop", "badge", "timesheet")
]


def set_back(data: Path, revision: str) -> None:
    """The copy's catalog at the old code's revision: the audit table is all it lacks."""
    with sqlite3.connect(data / "catalog.db") as db:
        db.execute("DROP TABLE IF EXISTS audit")
        db.execute("UPDATE alembic_version SET version_num = ?", (revision,))
    shutil.rmtree(data / "flat", ignore_errors=True)


def lag_from(metrics: str) -> tuple[float, str]:
    """(mean lag in ms, the upper bound of the bucket holding the 95th percentile)."""
    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for line in metrics.splitlines():
        if line.startswith("gateway_audit_lag_seconds_bucket"):
            bound = line.split('le="')[1].split('"')[0]
            buckets.append((float(bound), float(line.rsplit(" ", 1)[1])))
        elif line.startswith("gateway_audit_lag_seconds_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith("gateway_audit_lag_seconds_count"):
            count = float(line.rsplit(" ", 1)[1])
    p95 = next((b for b, n in buckets if n >= 0.95 * count), float("inf"))
    return (1000 * total / count if count else 0.0), f"<= {p95 * 1000:.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--old-tree", required=True)
    parser.add_argument("--old-revision", default="0003")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--queries", type=int, default=100, help="per batch")
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="measure-audit-"))
    os.chdir(work)  # so the interpreter's working directory never shadows --old-tree
    off_dir = work / "off"
    shutil.copytree(args.data_dir, off_dir, ignore=shutil.ignore_patterns("flat"))
    set_back(off_dir, args.old_revision)

    for issuer in ("on-issuer", "off-issuer"):
        (work / issuer).mkdir()
    on = throwaway_issuer(work / "on-issuer", args.data_dir)
    off = throwaway_issuer(work / "off-issuer", off_dir)
    off_env = {**off.env, "PYTHONPATH": args.old_tree}
    groups = tuple(synthetic.caller_groups(0.1))
    token_on = on.token(synthetic.TENANT, synthetic.REGION, groups)
    token_off = off.token(synthetic.TENANT, synthetic.REGION, groups)
    questions = [QUESTIONS[i % len(QUESTIONS)] + f" ticket {i}" for i in range(10_000)]
    latencies: dict[str, list[float]] = {"on": [], "off": []}
    with (
        running_gateway(["serve", "--no-worker"], on.env) as server_on,
        running_gateway(["serve", "--no-worker"], off_env) as server_off,
    ):
        drive(server_on.base, token_on, "/search", questions[:20], 1)  # warm both
        drive(server_off.base, token_off, "/search", questions[:20], 1)
        at = 20
        for round_ in range(args.rounds):
            order = [("on", server_on, token_on), ("off", server_off, token_off)]
            for name, server, token in order if round_ % 2 == 0 else order[::-1]:
                batch = questions[at : at + args.queries]
                at += args.queries
                latencies[name] += drive(server.base, token, "/search", batch, 1).latencies_ms
        for name, found in latencies.items():
            print(
                f"/search, audit and metrics {name}: {percentiles(found)} ({len(found)} requests)"
            )

        before = httpx.get(f"{server_on.base}/metrics").text
        started = time.monotonic()
        sent = 0
        while time.monotonic() - started < args.seconds:
            batch = questions[at : at + 400]
            at = (at + 400) % 9000
            sent += len(drive(server_on.base, token_on, "/search", batch, 8).latencies_ms)
        elapsed = time.monotonic() - started
        time.sleep(1)  # the writer's last batch
        after = httpx.get(f"{server_on.base}/metrics").text
    written = _written(after) - _written(before)
    mean, p95 = lag_from(after)
    print(
        f"8 clients for {elapsed:.0f} s: {sent} requests, {written:.0f} records written "
        f"({written / elapsed:.1f}/s); lag mean {mean:.0f} ms, p95 {p95}"
    )

    trail_dir = work / "trail"
    trail_dir.mkdir()
    engine = open_engine(f"sqlite:///{trail_dir / 'catalog.db'}")
    ensure_current(engine)
    trail = AuditTrail(engine)
    now = dt.datetime.now(dt.UTC)
    record = AuditRecord(
        time=now, tenant="bench", subject="caller-1", route="/search", status=200,
        duration_ms=12.3, trace_id="0" * 32, policy_version="v", index_generation=1,
        doc_ids=tuple(f"doc-{i}" for i in range(10)),
        chunk_ids=tuple(f"doc-{i}@1:0" for i in range(10)),
    )  # fmt: skip
    started = time.perf_counter()
    for _ in range(40):
        trail.write([record] * 500)
    print(f"AuditTrail.write on SQLite: {20_000 / (time.perf_counter() - started):.0f} records/s")


def _written(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith('gateway_audit_records_total{outcome="written"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


if __name__ == "__main__":
    main()
