"""Prometheus metrics (`GET /metrics`): the only prometheus_client importer.

One registry per app (no process-wide default registry, so two apps in one process never
mix their series). Labels are bounded by the code or the configuration: a route template,
a status code, a stage or lane name, a job status. Never an ID, a subject, a tenant, a
query or any text.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.telemetry.stages import StageClock

CONTENT_TYPE = CONTENT_TYPE_LATEST
__all__ = ["CONTENT_TYPE", "Metric", "Metrics", "MetricsMiddleware", "gauges"]
# Milliseconds to seconds: a request is a few ms to a few s; an LLM answer up to a minute.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
UNMATCHED = "unmatched"  # a path no route serves: never the path itself


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
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
        self.registry.register(_Collected(state))

    def observe_stages(self, clock: StageClock) -> None:
        for name, seconds in clock.timings_ms().items():
            self.stages.labels(name).observe(seconds / 1000)

    def observe_degraded(self, lanes: Iterable[str]) -> None:
        for lane in lanes:
            self.degraded.labels(lane).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def gauges(
    generation: int | None, generation_created: float | None, jobs: Mapping[str, int]
) -> list[Metric]:
    """The scraped-on-demand series, from what the app knows at that moment."""
    served = GaugeMetricFamily("gateway_index_generation", "The index generation served")
    age = GaugeMetricFamily(
        "gateway_index_generation_age_seconds", "Seconds since the served generation committed"
    )
    if generation is not None:
        served.add_metric([], generation)
    if generation_created is not None:
        age.add_metric([], max(0.0, time.time() - generation_created))
    queue = GaugeMetricFamily(
        "gateway_ingest_jobs", "Ingest jobs by status (every tenant)", labels=["status"]
    )
    for status in ("queued", "running", "succeeded", "failed"):
        queue.add_metric([status], jobs.get(status, 0))
    return [served, age, queue]


class _Collected:
    def __init__(self, state: Callable[[], Sequence[Metric]]) -> None:
        self._state = state

    def collect(self) -> Iterable[Metric]:
        return self._state()


class MetricsMiddleware:
    """Counts every request by its route template and status, and times it."""

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

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                self.metrics.duration.labels(route).observe(time.perf_counter() - started)
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.requests.labels(route, str(status)).inc()


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
