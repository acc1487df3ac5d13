"""The ingest routes connectors use to change a tenant's documents over HTTP.

Callers: admins of the tenant (per the policy) and the tenant's `ingest` API keys; a
`search` key or any other caller gets 403. The tenant is always the caller's: another
tenant's document answers 404, like a missing one. Each change writes one generation
without re-embedding and answers once this server serves it, so the very next request,
of anyone, is decided by it.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from gateway.api.schemas import AclChange, DocumentChanged, Problem
from gateway.api.security import CallerDep, StateDep
from gateway.api.state import AppState
from gateway.domain import Caller
from gateway.errors import GatewayError
from gateway.ingest.pipeline import delete_versions, set_acl
from gateway.ingest.writer import GenerationReport
from gateway.storage.layout import DataLayout

INGEST_PROBLEMS = {
    401: {"model": Problem, "description": "Missing or invalid credentials"},
    403: {"model": Problem, "description": "Not an admin of the tenant nor its ingest key"},
    404: {"model": Problem, "description": "No such document in your tenant"},
    413: {"model": Problem, "description": "Body over the route's limit"},
    422: {"model": Problem, "description": "Invalid request"},
}
ingest = APIRouter(prefix="/admin", responses=INGEST_PROBLEMS)  # type: ignore[arg-type]


async def ingest_caller(caller: CallerDep) -> Caller:
    if caller.scope == "ingest" or (caller.admin and caller.kind == "user"):
        return caller
    raise GatewayError("forbidden", "the ingest routes are for the tenant's admins and ingest keys")


IngestDep = Annotated[Caller, Depends(ingest_caller)]


@ingest.put("/documents/{doc_id:path}/acl", response_model=DocumentChanged)
async def put_acl(
    doc_id: str, body: AclChange, caller: IngestDep, state: StateDep
) -> DocumentChanged:
    """Replace the ACL of every version (or `version`) of one of the tenant's documents,
    without re-embedding."""
    layout = DataLayout(state.settings.data_dir)
    try:
        report = await asyncio.to_thread(
            set_acl, layout, caller.tenant, doc_id, body.acl, body.version
        )
    except GatewayError as exc:
        if exc.code != "invalid_document":
            raise
        raise GatewayError("validation_error", exc.detail) from exc  # ingest's own check
    return await _enforced(state, doc_id, report, report.revised if report else 0)


@ingest.delete("/documents/{doc_id:path}", response_model=DocumentChanged)
async def delete_document(
    doc_id: str,
    caller: IngestDep,
    state: StateDep,
    version: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
) -> DocumentChanged:
    """Remove every version (or `?version=`) of one of the tenant's documents; a version it
    had closed is reopened."""
    layout = DataLayout(state.settings.data_dir)
    report = await asyncio.to_thread(delete_versions, layout, caller.tenant, doc_id, version)
    return await _enforced(state, doc_id, report, report.deleted)


async def _enforced(
    state: AppState, doc_id: str, report: GenerationReport | None, versions: int
) -> DocumentChanged:
    """Answer once this server serves the change: the next request is decided by it."""
    if report is None:  # nothing to change: the generation serving already holds it
        served = state.indexes.served
        return DocumentChanged(
            doc_id=doc_id, versions=0, index_generation=served.number if served else None
        )
    try:
        index = await state.indexes.current()
    except GatewayError:
        index = None  # not servable here (e.g. not ready): the catalog holds the change
    generation = index.number if index is not None else report.generation
    return DocumentChanged(doc_id=doc_id, versions=versions, index_generation=generation)
