"""Drive a running gateway over HTTP: each query once, from C client threads; record what a
client sees (latency, status, degraded lanes) and what the server says each stage took."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import numpy as np

TIMEOUT_S = 60.0


@dataclass
class Phase:
    """One endpoint's run: a latency per request and the stage timings the server reported."""

    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    degraded: int = 0
    stages_ms: dict[str, list[float]] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def qps(self) -> float:
        return len(self.latencies_ms) / self.wall_s if self.wall_s else 0.0


def percentiles(values: Sequence[float], which: Sequence[int] = (50, 95, 99)) -> dict[str, float]:
    if not values:
        return {f"p{p}": 0.0 for p in which}
    return {f"p{p}": round(float(np.percentile(values, p)), 2) for p in which}


def drive(
    base: str,
    token: str,
    path: str,
    queries: Sequence[str],
    concurrency: int,
    body: dict[str, object] | None = None,
) -> Phase:
    """POST every query to `path` once, `concurrency` at a time, one connection each."""
    phase = Phase()
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    with httpx.Client(base_url=base, headers=headers, limits=limits, timeout=TIMEOUT_S) as client:

        def one(query: str) -> tuple[float, dict[str, object] | None]:
            started = time.perf_counter()
            try:
                response = client.post(path, json={"query": query, **(body or {})})
            except httpx.HTTPError:
                return (time.perf_counter() - started) * 1000, None
            elapsed = (time.perf_counter() - started) * 1000
            return elapsed, response.json() if response.status_code == 200 else None

        with ThreadPoolExecutor(concurrency) as pool:
            started = time.perf_counter()
            outcomes = list(pool.map(one, queries))
            phase.wall_s = time.perf_counter() - started

    for elapsed, payload in outcomes:
        phase.latencies_ms.append(elapsed)
        if payload is None:
            phase.errors += 1
            continue
        phase.degraded += bool(payload.get("degraded"))
        timings = payload.get("timings_ms")
        if isinstance(timings, dict):
            for stage, ms in timings.items():
                phase.stages_ms.setdefault(stage, []).append(float(ms))
    return phase
