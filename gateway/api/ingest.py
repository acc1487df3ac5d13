"""The ingest routes connectors use to change a tenant's documents over HTTP.

Callers: admins of the tenant (per the policy) and the tenant's `ingest` API keys; a
`search` key or any other caller gets 403. The tenant is always the caller's: another
tenant's document or job answers 404, like a missing one.

A batch of documents becomes a job in the durable queue (202; `?wait=true` answers when
it has ended), written by the writer (`gateway worker`, or the one `gateway serve`
starts). ACL changes and deletes are written at once, without re-embedding, and answer
once this server serves them, so the very next request, of anyone, is decided by them.

Each write's audit record names what it changed by IDs: the documents, their versions
(`doc_id@version`) and the job of a push; never a text.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response

from gateway.api.batches import validated_batch
from gateway.api.identifiers import NO_SUCH_VERSION, no_stored_id, printable_path
from gateway.api.schemas import (
    AclChange,
    DocumentChanged,
    DocumentError,
    IngestBatch,
    JobOut,
    Problem,
)
from gateway.api.security import CallerDep, PolicyDep, StateDep
from gateway.api.state import AppState
from gateway.api.strict_json import StrictJsonRoute
from gateway.authn.apikeys import key_may_write, pusher_of, within_prefix
from gateway.domain import Caller, version_label
from gateway.errors import GatewayError
from gateway.ingest.pipeline import delete_versions, set_acl
from gateway.ingest.records import record_of
from gateway.ingest.writer import GenerationReport
from gateway.storage.jobs import JobRow
from gateway.telemetry.audit import note, note_ids

WAIT_POLL_S = 0.05
WAIT_MAX_S = 600.0  # `?wait=true` answers 202 with the job as it is after this long
REPLICAS_WAIT_S = 5.0  # a replica seen recently that still has not swapped is logged
log = logging.getLogger("gateway.api")

INGEST_PROBLEMS = {
    401: {"model": Problem, "description": "Missing or invalid credentials"},
    403: {
        "model": Problem,
        "description": "Not an admin of the tenant nor its ingest key; for an ingest key, "
        "not_owner (a document it did not push) or outside_doc_prefix",
    },
    404: {"model": Problem, "description": "No such document in your tenant"},
    413: {"model": Problem, "description": "Body over the route's limit"},
    422: {"model": Problem, "description": "Invalid request"},
}


async def ingest_caller(caller: CallerDep) -> Caller:
    if caller.scope == "ingest" or (caller.admin and caller.kind == "user"):
        return caller
    raise GatewayError("forbidden", "the ingest routes are for the tenant's admins and ingest keys")


IngestDep = Annotated[Caller, Depends(ingest_caller)]
# The caller first (401, 403), then the path's identifiers (404 for one naming nothing).
ingest = APIRouter(
    prefix="/admin",
    responses=INGEST_PROBLEMS,  # type: ignore[arg-type]
    dependencies=[Depends(ingest_caller), Depends(printable_path)],
    route_class=StrictJsonRoute,
)
BATCH_BODY = {
    "required": True,
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/IngestBatch"}}},
}


@ingest.post(
    "/documents",
    status_code=202,
    response_model=JobOut,
    openapi_extra={"requestBody": BATCH_BODY},
    responses={
        200: {"model": JobOut, "description": "With ?wait=true: the job, ended"},
        202: {"description": "Queued: the job, and its URL in Location"},
        403: {
            "model": Problem,
            "description": "Not allowed, tenant_mismatch, not_owner or outside_doc_prefix",
        },
        429: {
            "model": Problem,
            "description": "ingest_backlog: the tenant's queue is full (jobs or bytes)",
            "headers": {"Retry-After": {"schema": {"type": "integer"}}},
        },
    },
)
async def post_documents(
    request: Request,
    response: Response,
    caller: IngestDep,
    policy: PolicyDep,
    state: StateDep,
    wait: Annotated[bool, Query(description="Answer when the job has ended")] = False,
) -> JobOut:
    """Queue 1 to 1,000 documents (all or nothing) as one job in the caller's tenant."""
    body = await request.body()
    documents = await asyncio.to_thread(validated_batch, body, caller.tenant)
    note_ids([d.doc_id for d in documents], [])
    note(versions=list(dict.fromkeys(version_label(d.doc_id, d.version) for d in documents)))
    await asyncio.to_thread(key_may_write, state.catalog, caller, [d.doc_id for d in documents])
    records = [record_of(d) for d in documents]
    # The bound of the policy this request was authorised under (and is audited with),
    # not of one a reload put in place while the body was read.
    queue = policy.policy.ingest
    job = await asyncio.to_thread(
        state.catalog.jobs.submit,
        caller.tenant,
        caller.subject,
        records,
        queue.max_pending_jobs,
        queue.max_pending_bytes,
    )
    note(job_id=job.job_id)
    response.headers["Location"] = f"/admin/jobs/{job.job_id}"
    if wait:
        job = await _until_ended(state, job)
        if job.status == "succeeded":
            await _served(state)
            note(index_generation=job.index_generation)
        if job.status in ("succeeded", "failed"):
            response.status_code = 200
    return job_out(job)


@ingest.get("/jobs/{job_id}", response_model=JobOut)
async def get_job(job_id: str, caller: IngestDep, state: StateDep) -> JobOut:
    """One of the tenant's ingest jobs: status, counts, the generation serving its result,
    and every error."""
    job = await asyncio.to_thread(state.catalog.jobs.job, caller.tenant, job_id)
    if job is None:
        raise GatewayError("not_found", "no such job in your tenant")
    return job_out(job)


def job_out(job: JobRow) -> JobOut:
    return JobOut(
        job_id=job.job_id,
        kind="ingest",
        status=job.status,  # type: ignore[arg-type]
        documents=job.documents,
        chunks=job.chunks,
        unchanged=job.unchanged,
        index_generation=job.index_generation,
        errors=[DocumentError(**e) for e in job.errors],
        created_at=job.created_at,
        finished_at=job.finished_at,
        documents_done=job.documents_done,
        chunks_done=job.chunks_done,
        chunks_planned=job.chunks_planned,
    )


async def _until_ended(state: AppState, job: JobRow) -> JobRow:
    deadline = time.monotonic() + WAIT_MAX_S
    while job.status in ("queued", "running") and time.monotonic() < deadline:
        await asyncio.sleep(WAIT_POLL_S)
        now = await asyncio.to_thread(state.catalog.jobs.job, job.tenant, job.job_id)
        job = now if now is not None else job
    return job


async def _served(state: AppState) -> int | None:
    """Until every replica serves the newest generation (the change's, or a later one): the
    next request to any of them is decided by it. Its number; None if not servable here."""
    try:
        index = await state.indexes.current(fresh=True)
    except GatewayError:
        return None  # not servable here (e.g. not ready): the catalog holds the change
    behind = await state.indexes.everywhere(index.number, REPLICAS_WAIT_S)
    if behind:  # seen a moment ago, yet not serving it: slow, or about to be gone
        log.warning("replicas %s do not serve generation %d yet", behind, index.number)
    return index.number


def describe_batch_body(app: FastAPI) -> None:
    """Puts the batch's schema in the OpenAPI components. The route reads the body itself,
    to list every problem of a batch in one answer, so FastAPI does not see the model."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        cached = app.openapi_schema is not None
        schema = generate()
        if not cached:
            batch = IngestBatch.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(batch.pop("$defs", {}))
            components["IngestBatch"] = batch
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


@ingest.put("/documents/{doc_id:path}/acl", response_model=DocumentChanged)
async def put_acl(
    doc_id: str, body: AclChange, caller: IngestDep, state: StateDep
) -> DocumentChanged:
    """Replace the ACL of every version (or `version`) of one of the tenant's documents,
    without re-embedding."""
    if body.version is not None and no_stored_id(body.version):
        raise GatewayError("not_found", NO_SUCH_VERSION)
    layout, by = state.layout, pusher_of(caller)
    await _note_versions(state, caller.tenant, doc_id, body.version)
    within_prefix(caller, [doc_id])
    try:
        report = await asyncio.to_thread(
            set_acl, layout, caller.tenant, doc_id, body.acl, body.version, only_by=by
        )
    except GatewayError as exc:
        if exc.code != "invalid_document":
            raise
        raise GatewayError("validation_error", exc.detail) from exc  # ingest's own check
    changed = report.revised + report.queued if report else 0
    return await _enforced(state, doc_id, report, changed)


@ingest.delete("/documents/{doc_id:path}", response_model=DocumentChanged)
async def delete_document(
    doc_id: str,
    caller: IngestDep,
    state: StateDep,
    version: Annotated[
        str | None,
        Query(min_length=1, description="Only this version (at most 1,024 bytes in UTF-8)"),
    ] = None,
) -> DocumentChanged:
    """Remove every version (or `?version=`) of one of the tenant's documents; a version it
    had closed is reopened."""
    if version is not None and no_stored_id(version):
        raise GatewayError("not_found", NO_SUCH_VERSION)
    layout = state.layout
    await _note_versions(state, caller.tenant, doc_id, version)
    within_prefix(caller, [doc_id])
    report = await asyncio.to_thread(
        delete_versions, layout, caller.tenant, doc_id, version, only_by=pusher_of(caller)
    )
    return await _enforced(state, doc_id, report, report.deleted + report.queued)


async def _note_versions(state: AppState, tenant: str, doc_id: str, version: str | None) -> None:
    """The audit record of an ACL change or delete names the document and the versions it
    is about (all stored ones when no version is named), refused or not. A doc_id from the
    path longer than any ingest accepts names no document: it is left out of the indexed
    IDs (PostgreSQL cannot index it, and a record that cannot be stored would hold back
    every tenant's records behind it); the record's `versions` still name it."""
    note_ids([] if no_stored_id(doc_id) else [doc_id], [])
    if version is not None:
        note(versions=[version_label(doc_id, version)])
        return
    rows = await asyncio.to_thread(state.catalog.versions_of, [(tenant, doc_id)])
    note(versions=sorted(version_label(doc_id, r.version) for r in rows))


async def _enforced(
    state: AppState, doc_id: str, report: GenerationReport | None, versions: int
) -> DocumentChanged:
    """Answer once every replica serves the change: the next request is decided by it."""
    if report is None:  # nothing to change: the generation serving already holds it
        served = state.indexes.served
        return DocumentChanged(
            doc_id=doc_id, versions=0, index_generation=served.number if served else None
        )
    generation = await _served(state)
    note(index_generation=generation or report.generation)
    return DocumentChanged(
        doc_id=doc_id, versions=versions, index_generation=generation or report.generation
    )
