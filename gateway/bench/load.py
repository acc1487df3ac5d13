"""Drive a running gateway over HTTP: each query once, from C client threads; record what a
client sees (latency, status, degraded lanes) and what the server says each stage took.

The client is the standard library's `http.client`, a keep-alive connection per thread:
it runs on the same cores as the server it measures, and httpx's client took 1.3-1.5 ms
of CPU a search there, a tenth of what the server could otherwise have used at eight
clients; `http.client` takes 0.5-0.8 ms (measured, 2026-11-28, `measure_hot_path.py`)."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np

TIMEOUT_S = 60.0


@dataclass
class Phase:
    """One endpoint's run: a latency per request and the stage timings the server reported."""

    latencies_ms: list[float] = field(default_factory=list)
    # Why requests failed ("503 Service not ready": the status and its problem's title;
    # "no response (ConnectionResetError)"; "200 unreadable"), with how many failed so.
    failures: Counter[str] = field(default_factory=Counter)
    degraded: int = 0
    stages_ms: dict[str, list[float]] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def errors(self) -> int:
        """Requests that failed or were not 200."""
        return sum(self.failures.values())

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
    where = urlsplit(base)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    connections = threading.local()
    opened: list[http.client.HTTPConnection] = []

    def connection() -> http.client.HTTPConnection:
        held: http.client.HTTPConnection | None = getattr(connections, "held", None)
        if held is None:
            held = http.client.HTTPConnection(where.hostname or "", where.port, timeout=TIMEOUT_S)
            connections.held = held
            opened.append(held)
        return held

    def one(query: str) -> tuple[float, str, dict[str, object] | None]:
        body_bytes = json.dumps({"query": query, **(body or {})}).encode()
        started = time.perf_counter()
        held = connection()
        try:
            held.request("POST", path, body=body_bytes, headers=headers)
            response = held.getresponse()
            payload = response.read()
        except (OSError, http.client.HTTPException) as exc:
            held.close()  # opened again by the next request of this thread
            elapsed = (time.perf_counter() - started) * 1000
            return elapsed, f"no response ({type(exc).__name__})", None
        elapsed = (time.perf_counter() - started) * 1000
        if response.status != 200:
            return elapsed, _failure(response.status, payload), None
        try:
            answer = json.loads(payload)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            return elapsed, "200 unreadable", None
        return elapsed, "", answer

    try:
        with ThreadPoolExecutor(concurrency) as pool:
            started = time.perf_counter()
            outcomes = list(pool.map(one, queries))
            phase.wall_s = time.perf_counter() - started
    finally:
        for held in opened:
            held.close()

    for elapsed, failure, payload in outcomes:
        phase.latencies_ms.append(elapsed)
        if payload is None:
            phase.failures[failure] += 1
            continue
        phase.degraded += bool(payload.get("degraded"))
        timings = payload.get("timings_ms")
        if isinstance(timings, dict):
            for stage, ms in timings.items():
                phase.stages_ms.setdefault(stage, []).append(float(ms))
    return phase


def _failure(status: int, payload: bytes) -> str:
    """The status and, where the body is a problem, its title (never its detail)."""
    try:
        title = json.loads(payload).get("title")
    except (ValueError, AttributeError):
        title = None
    return f"{status} {title}" if isinstance(title, str) else str(status)
