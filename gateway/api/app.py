"""The app factory: services are built at startup from Settings, never at import."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
from fastapi import FastAPI
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway import __version__
from gateway.answer.llm import LlmAnswerer
from gateway.answer.pipeline import AnswerPipeline
from gateway.api.admin import admin
from gateway.api.audit import AuditMiddleware, audit
from gateway.api.console import console
from gateway.api.cors import BrowserCors
from gateway.api.headers import PolicyVersionHeader
from gateway.api.ingest import describe_batch_body, ingest
from gateway.api.limits import RequestGuard
from gateway.api.mcp import McpDoor, McpEndpoint, McpSlash, wellknown
from gateway.api.openai_compat import v1
from gateway.api.problems import describe_problems_as_sent, install_problem_handlers
from gateway.api.processes import SNAPSHOT_EVERY_S, SharedDir, WriterReport
from gateway.api.ratelimit import RateLimiter, SharedRateLimiter
from gateway.api.routes import PUBLIC_PATHS, protected, public
from gateway.api.scim import scim
from gateway.api.scim_groups import groups as scim_groups
from gateway.api.state import AppState
from gateway.authn.devissuer import resolve_identity
from gateway.authn.directory import DirectoryIdentity
from gateway.authn.tokens import TokenVerifier, leeway_s
from gateway.embedding import Embedder, load_cross_encoder
from gateway.embedding.onnx_query import enable_fast_queries, query_threads
from gateway.embedding.precision import log_choice
from gateway.errors import GatewayError
from gateway.ingest.supervisor import WriterSupervisor
from gateway.placement import Placement
from gateway.policy.store import PolicyStore, reload_on_sighup, watch
from gateway.retrieval.lanes.bm25 import Bm25Lane
from gateway.retrieval.lanes.dense import DenseLane
from gateway.retrieval.lanes.exact import ExactLane
from gateway.retrieval.rerank import CrossEncoderReranker, KeepOrder, Reranker
from gateway.retrieval.search import HybridSearcher
from gateway.settings import Settings
from gateway.storage.current import ServedIndexes
from gateway.storage.layout import DataLayout
from gateway.telemetry import exceptions
from gateway.telemetry.audit import AuditLog
from gateway.telemetry.metrics import (
    LaneCounts,
    Metric,
    Metrics,
    MetricsMiddleware,
    Observed,
    gauges,
    snapshot,
    summed,
)
from gateway.telemetry.tracing import SpanExporter, Tracing

GENERATION_WATCH_S = 0.2  # with SQLite requests also check: this only saves them the wait

log = logging.getLogger("gateway.embedding")


def scraped(state: AppState) -> list[Metric]:
    """What `/metrics` reads from the app when scraped; the ingest queue only while the
    catalog answers (a scrape never fails for it). One of a group's processes adds its
    siblings' own series."""
    served = state.indexes.served
    try:
        jobs = state.catalog.jobs.counts()
    except GatewayError:
        jobs = {}
    created = served.generation.created_at if served is not None else None
    if created is not None and created.tzinfo is None:
        created = created.replace(tzinfo=dt.UTC)  # SQLite keeps no zone: it was UTC
    own = own_series(state) if state.shared is None else recorded_own_series(state, state.shared)
    seen = Observed(
        generation=served.number if served is not None else None,
        generation_created=created.timestamp() if created is not None else None,
        jobs=jobs,
        writer=None if state.writer is None else (state.writer.up, state.writer.restarts),
        **own,
    )
    if state.shared is not None:
        seen = summed(seen, state.shared.sibling_snapshots())
    return gauges(seen)


def own_series(state: AppState) -> dict[str, Any]:
    """The scraped series this process alone knows."""
    return {
        "lanes": {
            pool.name: LaneCounts(pool.abandoned_total, pool.abandoned, pool.skipped_total)
            for pool in state.searcher.pools
        },
        "jwks_fetches": dict(state.verifier.fetches),
        "policy_reloads": dict(state.policies.reloads),
        "audit_pending": state.audit.pending,
    }


def recorded_own_series(state: AppState, shared: SharedDir) -> dict[str, Any]:
    """`own_series`, also written for this process's siblings to sum. Written at each
    scrape too: a scrape of another process from then on counts at least this much of
    this one, so no counter seems to fall between scrapes of different processes."""
    with shared.lock:
        own = own_series(state)
        try:
            shared.write_json(shared.own_snapshot(), snapshot(own))
        except OSError:
            log.exception("this process's metrics could not be written for its siblings")
    return own


async def publish_own_series(state: AppState, shared: SharedDir) -> None:
    """For a group's process: its own series every SNAPSHOT_EVERY_S, for whichever process
    is scraped (the file stays once this process stops: its counters still count)."""
    while True:
        await asyncio.to_thread(recorded_own_series, state, shared)
        await asyncio.sleep(SNAPSHOT_EVERY_S)


def freeze_startup_objects() -> None:
    """Move every object the start made into the collector's permanent generation
    (gc.freeze), after collecting what is already garbage. Most live as long as the
    process (the model, the libraries), yet a full collection walked them all: serving
    SciFact one client at a time, one full collection in 300 searches took 170 ms, inside
    a search; frozen, 2.4 ms (measured 2026-11-28). What is dropped later (the generation
    served at startup, once replaced) is freed by its reference counts as before; only
    something in a reference cycle among them would never be. Objects made later are
    collected as before."""
    gc.collect()
    gc.freeze()
    log.info(
        "objects made by the start frozen out of garbage collection: %d", gc.get_freeze_count()
    )


class HeadAsGet:
    """HEAD is answered as GET (RFC 9110 9.3.2): load balancers and monitors probe with it,
    and the routes declare GET alone (so OpenAPI lists no HEAD). Every layer sees the GET:
    the same authentication, record, count and headers, Content-Length included; where GET
    is not served, HEAD is not either (the same 405). The server still sees the HEAD in its
    own scope and sends no body, as Starlette relies on for its own HEAD routes. No GET
    route streams (the event streams answer POST), so no HEAD runs one for nothing."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "HEAD":
            scope = {**scope, "method": "GET"}  # a copy: the server's scope keeps its HEAD
        await self.app(scope, receive, send)


def create_app(
    settings: Settings,
    embedder: Embedder | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    span_exporter: SpanExporter | None = None,
    llm_transport: httpx2.AsyncBaseTransport | None = None,
    writer: WriterSupervisor | WriterReport | None = None,
    shared: SharedDir | None = None,
    freeze_startup: bool = False,
) -> FastAPI:
    """`embedder` lets one process share a loaded model; `transport` reaches the issuer;
    `span_exporter` replaces the exporter chosen by the OTEL_* settings; `llm_transport`
    reaches the LLM endpoint (tests fake it there); `writer` is the writer of ingest jobs
    this process runs (or its group's parent reports), whose liveness `/readyz` and
    `/metrics` tell; `shared` the directory of this process's group, when it is one of
    a `gateway serve --processes N` (gateway/api/processes.py); `freeze_startup` hides
    what the start made from the garbage collector (`freeze_startup_objects`), for a
    process that serves one app until it stops (tests that build many apps leave it off)."""
    exceptions.install()  # however it is served, no exception's message reaches a log

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        policies = PolicyStore(settings.policy_dir)
        model = (
            embedder
            if embedder is not None
            else await asyncio.to_thread(Embedder, precision=settings.embedding_precision)
        )
        layout = DataLayout.configured(settings)
        catalog = layout.open_catalog()
        # Pool sizes are fixed for the life of the process; a reload changes budgets only.
        policy = policies.current.policy
        budgets = policy.budgets
        placement = Placement.plan(settings.lane_cpus, alone=shared is None)
        searcher = HybridSearcher(
            [Bm25Lane(), DenseLane(model, policy.retrieval), ExactLane()],
            workers=budgets.workers_per_lane,
            max_abandoned=budgets.max_abandoned_per_lane,
            placement=placement,
        )
        reranker: Reranker = KeepOrder()
        if settings.rerank_model is not None:
            score = await asyncio.to_thread(load_cross_encoder, settings.rerank_model)
            reranker = CrossEncoderReranker(score, policy.retrieval.rerank_candidates)
        llm = LlmAnswerer.from_settings(settings, llm_transport)
        indexes = await asyncio.to_thread(  # opens, and warms, the served generation
            ServedIndexes,
            layout,
            catalog,
            model.name,
            model.dim,
            table_above=lambda: policies.current.policy.retrieval.flat_search_max_rows,
            warm=settings.warm_index == "auto",
            vector_documents=lambda: policies.current.policy.retrieval.document_vector != "off",
        )
        state = AppState(
            settings=settings,
            layout=layout,
            policies=policies,
            embedder=model,
            catalog=catalog,
            indexes=indexes,
            verifier=TokenVerifier(resolve_identity(settings), transport=transport),
            searcher=searcher,
            answers=AnswerPipeline(searcher, model, catalog, reranker=reranker, llm=llm),
            tracing=Tracing(settings, exporter=span_exporter),
            metrics=metrics,
            limiter=SharedRateLimiter(shared.limits) if shared is not None else RateLimiter(),
            audit=AuditLog(catalog.audit, metrics, placement.others),
            directory=DirectoryIdentity(
                catalog.directory, catalog.directory_versions, leeway_s=leeway_s(settings)
            ),
            writer=writer,
            shared=shared,
        )
        metrics.watch(lambda: scraped(state))
        app.state.gateway = state
        if settings.fast_queries and not model.fast_queries:
            cache = settings.model_cache_dir or layout.root / "models"
            threads = query_threads(placement.dense)
            await asyncio.to_thread(enable_fast_queries, model, cache, threads)
        log_choice(log, model.numerics)
        await asyncio.to_thread(model.warm)  # the first query must meet its budget
        state.warmed = True
        if freeze_startup:
            freeze_startup_objects()
        watcher = (
            asyncio.create_task(watch(policies, settings.policy_watch_interval_s))
            if settings.policy_watch_interval_s > 0
            else None
        )
        stop_sighup = reload_on_sighup(policies)
        generations = asyncio.create_task(state.indexes.watch(GENERATION_WATCH_S))
        directory = asyncio.create_task(catalog.directory_versions.watch(GENERATION_WATCH_S))
        publishing = (
            asyncio.create_task(publish_own_series(state, shared)) if shared is not None else None
        )
        try:
            async with McpDoor().open() as state.mcp:  # tool calls stop before the rest closes
                yield
        finally:
            generations.cancel()
            directory.cancel()
            if publishing is not None:
                publishing.cancel()
            with contextlib.suppress(GatewayError):  # a catalog that is away forgets later
                await asyncio.to_thread(state.indexes.leave)
            if watcher is not None:
                watcher.cancel()
            if stop_sighup is not None:
                stop_sighup()
            state.searcher.close()
            await asyncio.to_thread(state.audit.close)  # writes what waits
            await state.verifier.aclose()
            if llm is not None:
                await llm.aclose()
            state.tracing.shutdown()

    metrics = Metrics()
    app = FastAPI(
        title="Permission-aware RAG gateway",
        version=__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    # `/search/` answers the 404 problem any unknown path does, not a 307 to `/search`:
    # a client following it paid the rate limit twice for one search, and a redirect
    # is an answer no route records.
    app.router.redirect_slashes = False
    mcp_route = Route("/mcp", McpEndpoint(), methods=["POST"], include_in_schema=False)
    routers = (public, protected, admin, audit, ingest, v1, wellknown, scim, scim_groups)
    routes = [mcp_route, *(r for router in routers for r in router.routes)]
    install_problem_handlers(app, [*routes, *console.routes])  # a 405 allows them all
    app.add_middleware(RequestGuard, public_paths=PUBLIC_PATHS)  # inside the header
    app.add_middleware(AuditMiddleware, routes=routes)  # inside the metrics: refusals count
    app.add_middleware(PolicyVersionHeader)  # outside the audit guard: its 503 names one too
    app.add_middleware(MetricsMiddleware, metrics=metrics, routes=routes)
    # Preflights are answered before any count or record: they carry no caller.
    app.add_middleware(BrowserCors, allowed_origins=settings.allowed_origin_set)
    app.add_middleware(McpSlash)  # /mcp/ is /mcp before anything sees it
    app.add_middleware(HeadAsGet)  # outermost: every layer sees the GET
    describe_problems_as_sent(app)
    describe_batch_body(app)
    app.include_router(public)
    app.include_router(protected)
    app.include_router(admin)
    app.include_router(audit)
    app.include_router(ingest)
    app.include_router(v1)
    app.include_router(wellknown)
    app.include_router(scim)
    app.include_router(scim_groups)
    app.router.routes.append(mcp_route)
    app.include_router(console)
    return app
