"""Routes of the public contract. Each is authenticated unless listed in PUBLIC_PATHS."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse

from gateway.answer.pipeline import AnswerEvent, EvidenceEvent, TokenEvent
from gateway.api.calls import (
    Asker,
    citation,
    finish_answer,
    request_attributes,
    run_answer,
    run_search,
    start_answer,
)
from gateway.api.identifiers import printable_path
from gateway.api.schemas import (
    AnswerRequest,
    AnswerResponse,
    ChunkOut,
    DocumentOut,
    Embedding,
    Health,
    Problem,
    Processes,
    SearchRequest,
    SearchResponse,
)
from gateway.api.security import (
    CallerDep,
    ClockDep,
    PolicyDep,
    StateDep,
    pinned_policy,
    reading_caller,
)
from gateway.api.strict_json import StrictJsonRoute
from gateway.errors import GatewayError
from gateway.retrieval.lookup import visible_chunk, visible_document
from gateway.retrieval.search import today_utc
from gateway.telemetry.audit import note_ids
from gateway.telemetry.metrics import CONTENT_TYPE
from gateway.telemetry.tracing import Tracing
from gateway.uris import shown_uri

log = logging.getLogger("gateway.api")
PUBLIC_PATHS = frozenset(
    {
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/console",
        "/console/",
        "/console/{asset}",
        "/console/sign-in.json",
        "/console/callback",
        # RFC 9728: how an MCP client learns where to get a token must need none
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    }
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
# Every read route refuses ingest keys (403), before the route runs; then a path naming
# what no write could have named is 404 (gateway.api.identifiers).
protected = APIRouter(
    responses=PROBLEMS,  # type: ignore[arg-type]
    dependencies=[Depends(reading_caller), Depends(printable_path)],
    route_class=StrictJsonRoute,  # a key given twice is refused
)


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
async def readyz(request: Request, state: StateDep) -> Health:
    # One policy for the whole answer: the one this request took as it arrived, which the
    # audit check below and the version reported (body and header) both come from.
    loaded = pinned_policy(request)
    served = state.indexes.served
    if not state.warmed or served is None:
        raise GatewayError("not_ready", "index or model not loaded yet")
    if state.indexes.warming_first:  # the data dir was empty at startup
        raise GatewayError("not_ready", "the first index generation is being warmed")
    refused = await asyncio.to_thread(state.indexes.refusal, True)  # asks the catalog itself
    if refused is not None:
        raise GatewayError("not_ready", refused)
    # A replica that must refuse the routes needing a record is not ready; asking here
    # retries at once, so it is ready again as soon as the database takes records.
    audit_required = loaded.policy.audit.required
    if state.audit.failing and audit_required and not await asyncio.to_thread(state.audit.flush):
        raise GatewayError("not_ready", "the audit trail cannot be written")
    if state.writer is not None and not state.writer.healthy():  # jobs would wait for nothing
        raise GatewayError("not_ready", "the writer of ingest jobs is down and not restarting")
    started = None if state.shared is None else state.shared.processes()
    reachable = state.indexes.store_reachable
    if reachable is False and await asyncio.to_thread(state.indexes.behind):
        raise GatewayError("not_ready", "a newer index generation cannot be fetched from the store")
    return Health(
        status="ready",
        index_generation=served.number,
        policy_version=loaded.version,
        embedding=Embedding(
            passages=state.embedder.numerics.label,
            queries=state.embedder.queries_label,
            index=served.generation.precisions.split(","),
        ),
        index_store=None if reachable is None else "reachable" if reachable else "unreachable",
        processes=None if started is None else Processes(**started),
    )


@protected.post("/search", response_model=SearchResponse, responses=TOO_LARGE)  # type: ignore[arg-type]
async def search(
    body: SearchRequest, caller: CallerDep, policy: PolicyDep, state: StateDep, clock: ClockDep
) -> SearchResponse:
    return await run_search(
        Asker(state, policy, caller, clock), body.query, body.top_k, body.group_by
    )


STREAM = "text/event-stream"
# The `error` event of a stream that failed past its start (a fault, not the caller's).
MID_STREAM_FAULT = GatewayError("internal_error", "the answer failed while it streamed; retry")
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
    asker = Asker(state, policy, caller, clock)
    if body.stream or _wants_stream(request.headers.get("accept", "")):
        return await _answer_stream(body, asker)
    return await run_answer(asker, body.query, body.top_k)


def _wants_stream(accept: str) -> bool:
    """Accept names the event stream and does not prefer JSON."""
    kinds = [part.split(";")[0].strip().lower() for part in accept.split(",")]
    return STREAM in kinds and "application/json" not in kinds


async def _answer_stream(body: AnswerRequest, asker: Asker) -> StreamingResponse:
    answer = await start_answer(asker, body.query, body.top_k)

    async def stream() -> AsyncIterator[bytes]:
        try:
            event: AnswerEvent = answer.first
            while True:
                if isinstance(event, EvidenceEvent):
                    shown = [e.hit for e in event.evidence]
                    note_ids((h.doc_id for h in shown), (h.chunk_id for h in shown))
                    yield _sse(
                        "evidence",
                        {"evidence": [citation(e.n, e).model_dump() for e in event.evidence]},
                    )
                elif isinstance(event, TokenEvent):
                    yield _sse("token", {"text": event.text})
                else:
                    final = finish_answer(answer, asker, event)
                    yield _sse("final", final.model_dump(mode="json"))
                    break
                event = await anext(answer.events)
        except GatewayError as exc:
            yield _sse("error", exc.problem())
            await answer.fail()
            return
        except Exception:  # a fault mid-stream: the client is told, never just cut off
            log.exception("an answer stream failed")  # the type and frames, no message
            yield _sse("error", MID_STREAM_FAULT.problem())
            await answer.fail()
            return
        except BaseException:
            await answer.fail()
            raise
        await answer.close()

    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(stream(), media_type=STREAM, headers=headers)


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


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
