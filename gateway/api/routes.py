"""Routes of the public contract. Each is authenticated unless listed in PUBLIC_PATHS."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse

from gateway.answer.context import Evidence
from gateway.answer.pipeline import AnswerEvent, AnswerOutcome, EvidenceEvent, TokenEvent
from gateway.api.schemas import (
    AnswerRequest,
    AnswerResponse,
    ChunkOut,
    Citation,
    DocumentOut,
    Health,
    Problem,
    SearchRequest,
    SearchResponse,
)
from gateway.api.security import CallerDep, ClockDep, PolicyDep, StateDep, reading_caller
from gateway.api.state import AppState
from gateway.domain import Caller
from gateway.errors import GatewayError
from gateway.policy.loader import LoadedPolicy
from gateway.retrieval.lookup import visible_chunk, visible_document
from gateway.retrieval.scope import RequestScope
from gateway.retrieval.search import today_utc
from gateway.storage.layout import ServedIndex
from gateway.telemetry.audit import note, note_ids
from gateway.telemetry.metrics import CONTENT_TYPE
from gateway.telemetry.stages import StageClock
from gateway.telemetry.tracing import Span, Tracing
from gateway.uris import shown_uri

PUBLIC_PATHS = frozenset(
    {"/healthz", "/readyz", "/metrics", "/openapi.json", "/console", "/console/{asset}"}
)
PROBLEMS = {
    401: {"model": Problem, "description": "Missing or invalid token"},
    403: {"model": Problem, "description": "Token lacks required claims"},
    422: {"model": Problem, "description": "Invalid request"},
    503: {"model": Problem, "description": "No lane answered in time, or not ready"},
}

# Routes with a request body: it is bounded, and refused unread beyond the bound.
TOO_LARGE = {413: {"model": Problem, "description": "Body over the route's limit"}}

public = APIRouter()
# Every read route refuses ingest keys (403), before the route runs.
protected = APIRouter(responses=PROBLEMS, dependencies=[Depends(reading_caller)])  # type: ignore[arg-type]


def request_attributes(caller: Caller, policy: LoadedPolicy) -> dict[str, object]:
    """Who asked under which policy: the subject ID and scope, never the token or claims."""
    return {
        "gateway.subject": caller.subject,
        "gateway.caller_kind": caller.kind,
        "gateway.tenant": caller.tenant,
        "gateway.region": caller.region,
        "gateway.policy_version": policy.version,
    }


@asynccontextmanager
async def _retrieval_span(
    name: str, state: AppState, policy: LoadedPolicy, caller: Caller, clock: StageClock, top_k: int
) -> AsyncIterator[tuple[Span, ServedIndex]]:
    """The request span of a route that retrieves, and the generation both lanes will read."""
    attributes = {**request_attributes(caller, policy), "gateway.top_k": top_k}
    try:
        with state.tracing.request(name, clock, **attributes) as span:
            index = await state.indexes.current()
            Tracing.set(span, **{"gateway.index_generation": index.number})
            note(index_generation=index.number)
            yield span, index
    finally:
        state.metrics.observe_stages(clock)


@public.get("/healthz", response_model=Health, response_model_exclude_none=True)
async def healthz() -> Health:
    return Health(status="ok")


@public.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {"schema": {"type": "string"}}}}},
)
async def metrics(state: StateDep) -> Response:
    """Prometheus metrics, text format (for the operators' network: see the docs)."""
    body = await asyncio.to_thread(state.metrics.exposition)
    return Response(body, media_type=CONTENT_TYPE)


@public.get(
    "/readyz",
    response_model=Health,
    response_model_exclude_none=True,
    responses={503: {"model": Problem}},
)
async def readyz(state: StateDep) -> Health:
    served = state.indexes.served
    if not state.warmed or served is None:
        raise GatewayError("not_ready", "index or model not loaded yet")
    refused = await asyncio.to_thread(state.indexes.refusal, True)  # asks the catalog itself
    if refused is not None:
        raise GatewayError("not_ready", refused)
    # A replica that must refuse the routes needing a record is not ready; asking here
    # retries at once, so it is ready again as soon as the database takes records.
    audit_required = state.policy.policy.audit.required
    if state.audit.failing and audit_required and not await asyncio.to_thread(state.audit.flush):
        raise GatewayError("not_ready", "the audit trail cannot be written")
    if state.writer is not None and not state.writer.healthy():  # jobs would wait for nothing
        raise GatewayError("not_ready", "the writer of ingest jobs is down and not restarting")
    reachable = state.indexes.store_reachable
    if reachable is False and await asyncio.to_thread(state.indexes.behind):
        raise GatewayError("not_ready", "a newer index generation cannot be fetched from the store")
    return Health(
        status="ready",
        index_generation=served.number,
        policy_version=state.policy.version,
        index_store=None if reachable is None else "reachable" if reachable else "unreachable",
    )


@protected.post("/search", response_model=SearchResponse, responses=TOO_LARGE)  # type: ignore[arg-type]
async def search(
    body: SearchRequest, caller: CallerDep, policy: PolicyDep, state: StateDep, clock: ClockDep
) -> SearchResponse:
    async with _retrieval_span("search", state, policy, caller, clock, body.top_k) as (span, index):
        scope = RequestScope(index, policy.policy, caller, body.query, body.top_k, clock)
        outcome = await state.searcher.search(scope, body.group_by)
        Tracing.set(
            span, **{"gateway.results": len(outcome.hits), "gateway.degraded": outcome.degraded}
        )
        state.metrics.observe_degraded(outcome.degraded)
        trace_id = Tracing.trace_id(span)
    note(degraded=list(outcome.degraded))
    note_ids((h.doc_id for h in outcome.hits), (h.chunk_id for h in outcome.hits))
    # Plain dicts validated once as a whole: half the cost of a model per result.
    results = [
        {
            "chunk_id": h.chunk_id,
            "doc_id": h.doc_id,
            "version": h.version,
            "title": h.title,
            "uri": h.uri,
            "score": h.score,
            "text": h.text,
            "lanes": h.lanes,
        }
        for h in outcome.hits
    ]
    return SearchResponse.model_validate(
        {
            "results": results,
            "degraded": outcome.degraded,
            "trace_id": trace_id,
            "policy_version": policy.version,
            "index_generation": outcome.generation,
            "timings_ms": clock.timings_ms(),
        }
    )


STREAM = "text/event-stream"
# Each event's name and the JSON document its data line carries.
SSE_DATA: dict[str, dict[str, Any]] = {
    "evidence": {
        "type": "object",
        "required": ["evidence"],
        "properties": {
            "evidence": {"type": "array", "items": {"$ref": "#/components/schemas/Citation"}}
        },
    },
    "token": {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}},
    "final": {"$ref": "#/components/schemas/AnswerResponse"},
    "error": {"$ref": "#/components/schemas/Problem"},
}
# One server-sent event, as OpenAPI 3.1 describes an event stream (the schema is that of
# each event): its name, and its data, a string holding JSON of the schema named for it.
SSE_EVENT = {
    "oneOf": [
        {
            "title": f"{name} event",
            "type": "object",
            "required": ["event", "data"],
            "properties": {
                "event": {"const": name},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": data,
                },
            },
        }
        for name, data in SSE_DATA.items()
    ]
}
ANSWER_RESPONSES = {
    200: {
        "description": "The answer; with `stream` (or `Accept: text/event-stream`), server-sent "
        "events: `evidence` (the numbered blocks), `token` (answer text as produced), then "
        "`final`, an AnswerResponse whose citations and abstention are authoritative; a "
        "failure after the stream began is an `error` event carrying a problem body.",
        "content": {STREAM: {"schema": SSE_EVENT}},
    },
    **TOO_LARGE,
}


@protected.post("/answer", response_model=AnswerResponse, responses=ANSWER_RESPONSES)  # type: ignore[arg-type]
async def answer(
    body: AnswerRequest,
    request: Request,
    caller: CallerDep,
    policy: PolicyDep,
    state: StateDep,
    clock: ClockDep,
) -> AnswerResponse | StreamingResponse:
    if body.stream or _wants_stream(request.headers.get("accept", "")):
        return await _answer_stream(body, caller, policy, state, clock)
    async with _retrieval_span("answer", state, policy, caller, clock, body.top_k) as (span, index):
        scope = RequestScope(index, policy.policy, caller, body.query, body.top_k, clock)
        outcome = await state.answers.answer(scope)
        Tracing.set(span, **_answer_attributes(outcome))
        state.metrics.observe_degraded(outcome.degraded)
        trace_id = Tracing.trace_id(span)
    return _answer_body(outcome, trace_id, policy, clock)


def _wants_stream(accept: str) -> bool:
    """Accept names the event stream and does not prefer JSON."""
    kinds = [part.split(";")[0].strip().lower() for part in accept.split(",")]
    return STREAM in kinds and "application/json" not in kinds


async def _answer_stream(
    body: AnswerRequest, caller: Caller, policy: LoadedPolicy, state: AppState, clock: StageClock
) -> StreamingResponse:
    """Retrieval runs before the response starts, so its failures (503, ...) keep their
    status; the request span stays open until the stream's last event."""
    stack = AsyncExitStack()
    span, index = await stack.enter_async_context(
        _retrieval_span("answer", state, policy, caller, clock, body.top_k)
    )
    scope = RequestScope(index, policy.policy, caller, body.query, body.top_k, clock)
    events = state.answers.events(scope)
    try:
        first = await anext(events)
    except BaseException:
        await stack.__aexit__(*sys.exc_info())
        raise

    async def stream() -> AsyncIterator[bytes]:
        try:
            event: AnswerEvent = first
            while True:
                if isinstance(event, EvidenceEvent):
                    shown = [e.hit for e in event.evidence]
                    note_ids((h.doc_id for h in shown), (h.chunk_id for h in shown))
                    yield _sse(
                        "evidence",
                        {"evidence": [_citation(e.n, e).model_dump() for e in event.evidence]},
                    )
                elif isinstance(event, TokenEvent):
                    yield _sse("token", {"text": event.text})
                else:
                    Tracing.set(span, **_answer_attributes(event))
                    state.metrics.observe_degraded(event.degraded)
                    final = _answer_body(event, Tracing.trace_id(span), policy, clock)
                    yield _sse("final", final.model_dump(mode="json"))
                    break
                event = await anext(events)
        except GatewayError as exc:
            yield _sse("error", exc.problem())
            await stack.__aexit__(*sys.exc_info())
            return
        except BaseException:
            await stack.__aexit__(*sys.exc_info())
            raise
        await stack.aclose()

    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(stream(), media_type=STREAM, headers=headers)


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _citation(n: int, e: Evidence) -> Citation:
    """Block `e` shown as [n]: in the evidence event n is its own number, in the answer
    the number the answer cites it by."""
    h = e.hit
    return Citation(
        n=n, chunk_id=h.chunk_id, doc_id=h.doc_id, version=h.version, title=h.title, uri=h.uri
    )


def _answer_body(
    outcome: AnswerOutcome, trace_id: str, policy: LoadedPolicy, clock: StageClock
) -> AnswerResponse:
    """The answer's body (streamed or not), once per answer."""
    cited = [e.hit for _, e in outcome.citations]
    note_ids((h.doc_id for h in cited), (h.chunk_id for h in cited))
    note(degraded=list(outcome.degraded), abstain_reason=outcome.answer.reason)
    return AnswerResponse(
        answer=outcome.answer.text,
        abstained=outcome.answer.abstained,
        abstain_reason=outcome.answer.reason,
        citations=[_citation(n, e) for n, e in outcome.citations],
        degraded=outcome.degraded,
        trace_id=trace_id,
        policy_version=policy.version,
        index_generation=outcome.generation,
        timings_ms=clock.timings_ms(),
    )


def _answer_attributes(outcome: AnswerOutcome) -> dict[str, object]:
    return {
        "gateway.abstained": outcome.answer.abstained,
        "gateway.abstain_reason": outcome.answer.reason,
        "gateway.citations": [e.hit.chunk_id for _n, e in outcome.citations],
        "gateway.degraded": outcome.degraded,
    }


NOT_FOUND = {404: {"model": Problem, "description": "Missing, or not visible to the caller"}}


@protected.get("/documents/{doc_id:path}", response_model=DocumentOut, responses=NOT_FOUND)  # type: ignore[arg-type]
async def get_document(
    doc_id: str, caller: CallerDep, policy: PolicyDep, state: StateDep, clock: ClockDep
) -> DocumentOut:
    with state.tracing.request("document", clock, **request_attributes(caller, policy)) as span:
        row = visible_document(state.catalog, caller, doc_id, today_utc())
        # The ID asked for is the caller's input; only a found version is recorded.
        Tracing.set(span, **{"gateway.found": row is not None})
        if row is None:
            raise GatewayError("not_found", "no such document")
        Tracing.set(span, **{"gateway.doc_key": row.label})
    note_ids([row.doc_id], [])
    chunks = state.catalog.chunks_of(row.tenant, row.doc_id, row.version)
    return DocumentOut(
        doc_id=row.doc_id,
        version=row.version,
        title=row.title,
        uri=shown_uri(row.uri),
        tenant=row.tenant,
        region=row.region,
        effective_from=row.effective_from,
        effective_to=row.effective_to,
        text=row.text,
        chunk_ids=[c.chunk_id for c in chunks],
    )


@protected.get("/chunks/{chunk_id:path}", response_model=ChunkOut, responses=NOT_FOUND)  # type: ignore[arg-type]
async def get_chunk(
    chunk_id: str, caller: CallerDep, policy: PolicyDep, state: StateDep, clock: ClockDep
) -> ChunkOut:
    with state.tracing.request("chunk", clock, **request_attributes(caller, policy)) as span:
        found = visible_chunk(state.catalog, caller, chunk_id, today_utc())
        Tracing.set(span, **{"gateway.found": found is not None})
        if found is None:
            raise GatewayError("not_found", "no such chunk")
        Tracing.set(span, **{"gateway.chunk_id": found[0].chunk_id})
    note_ids([found[0].doc_id], [found[0].chunk_id])
    chunk, document = found
    return ChunkOut(
        chunk_id=chunk.chunk_id,
        doc_id=chunk.doc_id,
        version=chunk.version,
        ordinal=chunk.ordinal,
        title=document.title,
        uri=shown_uri(document.uri),
        text=chunk.text,
        token_count=chunk.token_count,
    )
