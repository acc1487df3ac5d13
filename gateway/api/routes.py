"""Routes of the public contract. Each is authenticated unless listed in PUBLIC_PATHS."""

from __future__ import annotations

import uuid

from fastapi import APIRouter

from gateway.api.schemas import (
    Health,
    LaneRanks,
    Problem,
    SearchRequest,
    SearchResponse,
    SearchResult,
)
from gateway.api.security import CallerDep, StateDep
from gateway.errors import GatewayError

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json"})
PROBLEMS = {
    401: {"model": Problem, "description": "Missing or invalid token"},
    403: {"model": Problem, "description": "Token lacks required claims"},
    422: {"model": Problem, "description": "Invalid request"},
    503: {"model": Problem, "description": "No lane answered in time, or not ready"},
}

public = APIRouter()
protected = APIRouter(responses=PROBLEMS)  # type: ignore[arg-type]


@public.get("/healthz", response_model=Health, response_model_exclude_none=True)
async def healthz() -> Health:
    return Health(status="ok")


@public.get("/readyz", response_model=Health, responses={503: {"model": Problem}})
async def readyz(state: StateDep) -> Health:
    served = state.indexes.refresh()
    if not state.warmed or served is None:
        raise GatewayError("not_ready", "index or model not loaded yet")
    return Health(
        status="ready", index_generation=served.number, policy_version=state.policy.version
    )


@protected.post("/search", response_model=SearchResponse)
async def search(body: SearchRequest, caller: CallerDep, state: StateDep) -> SearchResponse:
    index = state.indexes.get()
    outcome = await state.searcher.search(
        index, state.policy.policy, caller, body.query, body.top_k, body.group_by
    )
    return SearchResponse(
        results=[
            SearchResult(
                chunk_id=h.chunk_id,
                doc_id=h.doc_id,
                version=h.version,
                title=h.title,
                uri=h.uri,
                score=h.score,
                text=h.text,
                lanes=LaneRanks(**h.lanes),
            )
            for h in outcome.hits
        ],
        degraded=outcome.degraded,
        trace_id=uuid.uuid4().hex,
        policy_version=state.policy.version,
        index_generation=outcome.generation,
    )
