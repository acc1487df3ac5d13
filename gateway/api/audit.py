"""The audit trail over HTTP: one record per request whose caller was resolved, and
`GET /admin/audit` for the admins of a tenant.

Requests without a resolved caller (401, 413, a refusal before routing) are counted by the
metrics, not audited: they have no "who", and an anonymous flood must cost almost nothing.
The record is queued once the response has been sent (for a stream, after its last event),
with the status the client got; for an MCP tool call, whose error the client gets inside a
200, the status the route the tool mirrors would have answered (`RECORDED_STATUS`). While
records cannot be kept (`AuditLog.refusing`), a route that requires one is refused 503,
but only for a caller that authenticates: any other gets the 401 (or 403) it would get
anyway, without waiting for or waking the audit writer.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Annotated

from fastapi import APIRouter, Query
from starlette.requests import Request
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.admin import ADMIN_PROBLEMS
from gateway.api.identifiers import no_stored_id
from gateway.api.mcp import RECORDED_STATUS, base_url, challenge, mcp_audiences
from gateway.api.problems import problem_response
from gateway.api.schemas import AuditPage, Moment
from gateway.api.security import (
    SCIM_ONLY,
    AdminDep,
    StateDep,
    authenticate,
    bearer,
    pinned_policy,
)
from gateway.api.state import AppState
from gateway.domain import MAX_SUBJECT_BYTES, canonical_name
from gateway.errors import GatewayError
from gateway.storage.audit import DEFAULT_WINDOW, AuditRecord, as_json
from gateway.telemetry.audit import recording
from gateway.telemetry.metrics import route_template

# Doors that run another route's pipeline: required wherever a route they mirror is, or a
# caller would get through /mcp or /v1 the answer /search or /answer refuses without record.
MIRRORS = {
    "/mcp": ("/search", "/answer", "/documents/{doc_id}", "/chunks/{chunk_id}"),
    "/v1/chat/completions": ("/answer",),
}


def record_required(route: str, required: tuple[str, ...]) -> bool:
    return route in required or any(r in required for r in MIRRORS.get(route, ()))


class AuditMiddleware:
    def __init__(self, app: ASGIApp, routes: list[BaseRoute]) -> None:
        self.app, self.routes = app, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = getattr(scope.get("app"), "state", None)
        gateway = getattr(state, "gateway", None)
        if scope["type"] != "http" or gateway is None:
            await self.app(scope, receive, send)
            return
        audit_log = gateway.audit
        route = scope.get("route_template") or route_template(scope, self.routes)
        # The request's policy, taken here as it arrives and kept: whether it needs a record
        # and all the route decides come from one policy, whatever reload lands meanwhile.
        loaded = pinned_policy(Request(scope))
        required = record_required(route, loaded.policy.audit.required)
        if required and audit_log.refusing:
            # A caller without valid credentials gets its 401 (or 403) as usual, decided
            # by the route's own authentication from the headers (no body is read); it
            # would leave no record, so it neither waits for the writer nor wakes it (an
            # anonymous flood must not turn into tries of the refusing database).
            unknown = await _unauthenticated(scope, gateway, route)
            if unknown is not None:
                await problem_response(unknown, scope["path"])(scope, receive, send)
                return
            if not await audit_log.settled():
                audit_log.refused()
                refusal = GatewayError(audit_log.refusal, "the audit trail cannot be written")
                await problem_response(refusal, scope["path"])(scope, receive, send)
                return
        arrived, started = dt.datetime.now(dt.UTC), time.perf_counter()
        status = 500  # what the server sends if the app fails before starting a response

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with recording() as facts:
            try:
                await self.app(scope, receive, sending)
            finally:
                if facts.subject is not None and facts.tenant is not None:
                    audit_log.add(
                        AuditRecord(
                            time=arrived,
                            tenant=facts.tenant,
                            subject=facts.subject,
                            route=route,
                            status=_recorded(scope, status),
                            duration_ms=(time.perf_counter() - started) * 1000,
                            trace_id=facts.trace_id,
                            policy_version=facts.policy_version,
                            index_generation=facts.index_generation,
                            doc_ids=tuple(facts.doc_ids),
                            chunk_ids=tuple(facts.chunk_ids),
                            degraded=tuple(facts.degraded),
                            abstain_reason=facts.abstain_reason,
                            versions=tuple(facts.versions),
                            job_id=facts.job_id,
                            tool=facts.tool,
                        )
                    )


def _recorded(scope: Scope, status: int) -> int:
    """The status the record carries: the one a tool call set (a tool's error is a 200 to
    the client, but /search would have answered 503), or the one the client got."""
    recorded = scope.get(RECORDED_STATUS) if status == 200 else None
    return recorded if isinstance(recorded, int) else status


async def _unauthenticated(scope: Scope, gateway: AppState, route: str) -> GatewayError | None:
    """Why the route's own authentication would refuse this request, or None when it names
    a caller. On the request's own state: the route, when served, reuses the caller
    resolved here (`authenticate`) and spends its rate limit itself. The error is answered
    here, not by the route, so a second verdict can never let a request through
    unrecorded."""
    request = Request(scope)
    mcp, scim = route == "/mcp", route.startswith("/scim/v2")
    try:
        credentials = await bearer(request)
        audiences = mcp_audiences(gateway.settings) if mcp else ()
        caller = await authenticate(request, credentials, audiences, scim=scim)
        if scim and caller.scope != "scim":  # as `scim_caller` refuses it
            raise GatewayError("forbidden", SCIM_ONLY)
    except GatewayError as exc:
        if mcp and exc.code == "unauthenticated":  # /mcp's challenge, as it sends it
            sent = request.headers.get("authorization") is not None
            www = challenge(base_url(gateway.settings, request), sent)
            return GatewayError(exc.code, exc.detail, headers={"WWW-Authenticate": www})
        return exc
    return None


audit = APIRouter(prefix="/admin", responses=ADMIN_PROBLEMS)  # type: ignore[arg-type]
MAX_LIMIT = 1000
NO_NUL = r"^[^\x00]*$"  # no database stores a NUL in a string


@audit.get("/audit", response_model=AuditPage)
async def get_audit(
    admin: AdminDep,
    state: StateDep,
    subject: Annotated[str | None, Query(pattern=NO_NUL)] = None,
    doc_id: Annotated[str | None, Query(pattern=NO_NUL)] = None,
    since: Annotated[
        Moment | None,
        Query(description="From this moment; absent: 7 days before `until` (or now)"),
    ] = None,
    until: Moment | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 100,
    before: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> AuditPage:
    """The audit records of the admin's tenant, newest recorded first; `next_before`
    continues the listing (absent on the last page). Without `since`, the records of the
    7 days before `until` (or now)."""
    end = _utc(until)
    start = _utc(since) or (end or dt.datetime.now(dt.UTC)) - DEFAULT_WINDOW
    if _too_long_a_subject(subject) or (doc_id is not None and no_stored_id(doc_id)):
        return AuditPage(records=[], next_before=None)  # no record holds such a one
    # In a thread: a query of a long trail must not hold up the event loop (/healthz).
    rows = await asyncio.to_thread(
        state.catalog.audit.find,
        admin.tenant,
        subject=subject,
        doc_id=doc_id,
        since=start,
        until=end,
        before=before,
        limit=limit,
    )
    next_before = rows[-1].id if len(rows) == limit else None
    return AuditPage.model_validate(
        {"records": [as_json(r) for r in rows], "next_before": next_before}
    )


def _too_long_a_subject(subject: str | None) -> bool:
    """Whether `subject` is longer than any a record holds (kept in NFC, measured so)."""
    return subject is not None and len(canonical_name(subject).encode()) > MAX_SUBJECT_BYTES


def _utc(moment: dt.datetime | None) -> dt.datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=dt.UTC)  # a time without a zone is UTC
