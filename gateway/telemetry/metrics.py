"""Prometheus metrics (`GET /metrics`): the only prometheus_client importer.

One registry per app (no process-wide default registry, so two apps in one process never
mix their series). The processes of one `gateway serve --processes N` answer as one
server: counters and histograms go through prometheus_client's multiprocess files
(PROMETHEUS_MULTIPROC_DIR, set by the parent before any child imports prometheus_client),
and the series a process reads of itself when scraped are summed with its siblings' last
snapshots (`snapshot`, `summed`; gateway/api/processes.py).

Labels are bounded by the code or the configuration: a route template, a status code, a
stage or lane name, a job status. Never an ID, a subject, a tenant, a query or any text.
"""

from __future__ import annotations

import os
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.telemetry.stages import StageClock

CONTENT_TYPE = CONTENT_TYPE_LATEST
__all__ = [
    "CONTENT_TYPE",
    "LaneCounts",
    "Metric",
    "Metrics",
    "MetricsMiddleware",
    "Observed",
    "gauges",
]
# Milliseconds to seconds: a request is a few ms to a few s; an LLM answer up to a minute.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
UNMATCHED = "unmatched"  # a path no route serves: never the path itself


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # One of a group's processes: prometheus_client keeps the values in these files.
        self._multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        self._watched: list[_Collected] = []
        self.requests = Counter(
            "gateway_requests", "Requests answered, by route template and status",
            ["route", "status"], registry=self.registry,
        )  # fmt: skip
        self.duration = Histogram(
            "gateway_request_duration_seconds", "Time to the response's first byte, by route",
            ["route"], buckets=BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.stages = Histogram(
            "gateway_stage_duration_seconds", "Time of each stage of /search and /answer",
            ["stage"], buckets=BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.degraded = Counter(
            "gateway_degraded", "Requests answered without a lane (it failed or ran out of time)",
            ["lane"], registry=self.registry,
        )  # fmt: skip
        self.rate_limited = Counter(
            "gateway_rate_limited", "Requests refused 429 by the policy's limits",
            registry=self.registry,
        )  # fmt: skip
        self.directory_unnamed = Counter(
            "gateway_directory_unnamed", "Tokens refused 403 insufficient_claims: their tenant "
            "has a directory and they lack its user claim", registry=self.registry,
        )  # fmt: skip
        # tool: search | fetch | answer | other (a name off the wire never becomes a label)
        self.mcp_tool_calls = Counter(
            "gateway_mcp_tool_calls", "MCP tool calls, by tool and outcome (ok, tool_error, "
            "rate_limited, not_ready)", ["tool", "outcome"], registry=self.registry,
        )  # fmt: skip
        self.mcp_tool_duration = Histogram(
            "gateway_mcp_tool_duration_seconds", "Time MCP tools took, by tool",
            ["tool"], buckets=BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.audit_records = Counter(
            "gateway_audit_records", "Audit records: written, or dropped (never written)",
            ["outcome"], registry=self.registry,
        )  # fmt: skip
        self.audit_lag = Histogram(
            "gateway_audit_lag_seconds", "From a request's arrival to its audit record's commit",
            buckets=BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.audit_failures = Counter(
            "gateway_audit_write_failures", "Batches of audit records the database refused",
            registry=self.registry,
        )  # fmt: skip
        self.audit_refused = Counter(
            "gateway_audit_refused", "Requests refused 503 because their record could not be kept",
            registry=self.registry,
        )  # fmt: skip

    def watch(self, state: Callable[[], Sequence[Metric]]) -> None:
        """Series read when scraped (the served generation, the ingest queue)."""
        collected = _Collected(state)
        self._watched.append(collected)
        self.registry.register(collected)

    def observe_stages(self, clock: StageClock) -> None:
        for name, seconds in clock.timings_ms().items():
            self.stages.labels(name).observe(seconds / 1000)

    def observe_degraded(self, lanes: Iterable[str]) -> None:
        for lane in lanes:
            self.degraded.labels(lane).inc()

    def exposition(self) -> bytes:
        if self._multiprocess_dir is None:
            return generate_latest(self.registry)
        # Every process's counters and histograms, summed from their files, and this
        # process's scraped series (themselves summed with its siblings').
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self._multiprocess_dir)  # type: ignore[no-untyped-call]
        for collected in self._watched:
            registry.register(collected)
        return generate_latest(registry)


@dataclass(frozen=True)
class LaneCounts:
    abandoned_total: int  # calls whose result missed their budget (it is not used)
    abandoned_running: int  # of those, still running now
    skipped_total: int  # calls refused while too many were still running


@dataclass(frozen=True)
class Observed:
    """What the app knows when scraped; counters kept by the parts that count them."""

    generation: int | None
    generation_created: float | None  # epoch seconds
    jobs: Mapping[str, int]
    lanes: Mapping[str, LaneCounts]
    jwks_fetches: Mapping[str, int]  # ok, failed
    policy_reloads: Mapping[str, int]  # loaded, unchanged, refused
    audit_pending: int
    writer: tuple[bool, int] | None = None  # (up, restarts) of the writer this process runs


def snapshot(own: Mapping[str, Any]) -> dict[str, Any]:
    """The series a process reads of itself alone (`Observed`'s lanes, jwks_fetches,
    policy_reloads and audit_pending), as JSON for its siblings to sum."""
    lanes: Mapping[str, LaneCounts] = own["lanes"]
    return {**own, "lanes": {name: list(vars(counts).values()) for name, counts in lanes.items()}}


def summed(seen: Observed, siblings: Iterable[tuple[Mapping[str, Any], bool]]) -> Observed:
    """`seen` with its siblings' snapshots added: their counters whether or not they still
    run (as prometheus_client keeps a dead process's counters), their gauges (abandoned
    calls running, audit records pending) only while they run."""
    lanes = {name: list(vars(counts).values()) for name, counts in seen.lanes.items()}
    jwks, reloads = Tally(seen.jwks_fetches), Tally(seen.policy_reloads)
    pending = seen.audit_pending
    for other, alive in siblings:
        for name, (abandoned, running, skipped) in other["lanes"].items():
            mine = lanes.setdefault(name, [0, 0, 0])
            lanes[name] = [mine[0] + abandoned, mine[1] + running * alive, mine[2] + skipped]
        jwks.update(other["jwks_fetches"])
        reloads.update(other["policy_reloads"])
        pending += other["audit_pending"] * alive
    return replace(
        seen,
        lanes={name: LaneCounts(*counts) for name, counts in lanes.items()},
        jwks_fetches=dict(jwks),
        policy_reloads=dict(reloads),
        audit_pending=pending,
    )


def gauges(seen: Observed) -> list[Metric]:
    """The scraped-on-demand series."""
    served = GaugeMetricFamily("gateway_index_generation", "The index generation served")
    age = GaugeMetricFamily(
        "gateway_index_generation_age_seconds", "Seconds since the served generation committed"
    )
    if seen.generation is not None:
        served.add_metric([], seen.generation)
    if seen.generation_created is not None:
        age.add_metric([], max(0.0, time.time() - seen.generation_created))
    queue = GaugeMetricFamily(
        "gateway_ingest_jobs", "Ingest jobs by status (every tenant)", labels=["status"]
    )
    for status in ("queued", "running", "succeeded", "failed"):
        queue.add_metric([status], seen.jobs.get(status, 0))
    abandoned = CounterMetricFamily(
        "gateway_lane_abandoned", "Lane calls whose result missed their budget", labels=["lane"]
    )
    running = GaugeMetricFamily(
        "gateway_lane_abandoned_running", "Abandoned lane calls still running", labels=["lane"]
    )
    skipped = CounterMetricFamily(
        "gateway_lane_skipped",
        "Lane calls not made: too many abandoned ones were still running",
        labels=["lane"],
    )
    for lane, counts in sorted(seen.lanes.items()):
        abandoned.add_metric([lane], counts.abandoned_total)
        running.add_metric([lane], counts.abandoned_running)
        skipped.add_metric([lane], counts.skipped_total)
    jwks = CounterMetricFamily(
        "gateway_jwks_fetches", "JWKS fetches from the issuer, by outcome", labels=["outcome"]
    )
    for outcome in ("ok", "failed"):
        jwks.add_metric([outcome], seen.jwks_fetches.get(outcome, 0))
    reloads = CounterMetricFamily(
        "gateway_policy_reloads", "Policy reloads, by outcome", labels=["outcome"]
    )
    for outcome in ("loaded", "unchanged", "refused"):
        reloads.add_metric([outcome], seen.policy_reloads.get(outcome, 0))
    pending = GaugeMetricFamily(
        "gateway_audit_pending", "Audit records queued in this process, not yet written"
    )
    pending.add_metric([], seen.audit_pending)
    families = [served, age, queue, abandoned, running, skipped, jwks, reloads, pending]
    if seen.writer is not None:  # only a server that runs the writer (`serve`) tells of it
        up, restarts = seen.writer
        writer_up = GaugeMetricFamily(
            "gateway_writer_up", "1 while the writer of ingest jobs this server runs is up"
        )
        writer_up.add_metric([], 1 if up else 0)
        restarted = CounterMetricFamily(
            "gateway_writer_restarts", "Restarts of the writer this server runs, after it died"
        )
        restarted.add_metric([], restarts)
        families += [writer_up, restarted]
    return families


class _Collected:
    def __init__(self, state: Callable[[], Sequence[Metric]]) -> None:
        self._state = state

    def collect(self) -> Iterable[Metric]:
        return self._state()


class MetricsMiddleware:
    """Counts every request by its route template and status, and times it. A request is
    counted before its response's last part is sent, so a client holding the whole
    response finds it counted when it scrapes next."""

    def __init__(self, app: ASGIApp, metrics: Metrics, routes: Sequence[BaseRoute]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the server sends if the app fails before starting a response
        # Matched here, not taken from the router: a request refused before routing (401,
        # 413) still counts under its route.
        route = scope["route_template"] = route_template(scope, self.routes)

        counted = False

        def count() -> None:
            nonlocal counted
            if not counted:
                counted = True
                self.metrics.requests.labels(route, str(status)).inc()

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                self.metrics.duration.labels(route).observe(time.perf_counter() - started)
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                count()
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            count()  # a failure before or while responding counts too, once


def route_template(scope: Scope, routes: Sequence[BaseRoute]) -> str:
    """The template of the route that serves the request (as OpenAPI names it), or of one
    whose path matches with another method (a 405); UNMATCHED otherwise."""
    partial = UNMATCHED
    for candidate in routes:
        match, _ = candidate.matches(scope)
        path = getattr(candidate, "path_format", None)
        if match is Match.FULL and isinstance(path, str):
            return path
        if match is Match.PARTIAL and isinstance(path, str) and partial == UNMATCHED:
            partial = path
    return partial
