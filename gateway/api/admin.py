"""Admin routes: the serving policy, reloading it, and why a caller sees a document.

Two roles, both named in the policy. Admins (`admins:`) are admins of the tenant in their
own token: they explain documents of that tenant only (another tenant's document answers
404, exactly like a missing one). Operators (`operators:`) act on what every tenant
shares: reading and reloading the policy. Anyone else gets 403.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from gateway.api.calls import request_attributes
from gateway.api.identifiers import no_stored_id
from gateway.api.ingest import job_out
from gateway.api.processes import reload_everywhere
from gateway.api.schemas import (
    ClaimNamesOut,
    ExplainCaller,
    ExplainRequest,
    ExplainResponse,
    ExplainVersion,
    IndexOut,
    PolicyOut,
    PolicyPreview,
    PreviewChange,
    PreviewCoverage,
    PreviewRequest,
    Problem,
    ReloadOut,
)
from gateway.api.security import AdminDep, CallerDep, ClockDep, PolicyDep, StateDep
from gateway.api.state import AppState
from gateway.api.strict_json import StrictJsonRoute
from gateway.domain import Caller
from gateway.errors import GatewayError
from gateway.policy.bounds import check_files, check_policy
from gateway.policy.changes import PolicyDiff
from gateway.policy.diff import DiffTimeout, diff_policies
from gateway.policy.loader import load_policy_files
from gateway.policy.resolve import resolve_caller
from gateway.retrieval.explain import VersionDecision, document_versions, explain
from gateway.retrieval.search import today_utc

ADMIN_PROBLEMS = {
    401: {"model": Problem, "description": "Missing or invalid token"},
    403: {"model": Problem, "description": "Not an admin of the tenant, or not an operator"},
    413: {"model": Problem, "description": "Body over the route's limit"},
    422: {"model": Problem, "description": "Invalid request"},
}
# A body that gives a key twice is refused, as the ingest routes' (StrictJsonRoute).
admin = APIRouter(
    prefix="/admin",
    responses=ADMIN_PROBLEMS,  # type: ignore[arg-type]
    route_class=StrictJsonRoute,
)


async def operator_caller(caller: CallerDep) -> Caller:
    if not caller.operator:
        raise GatewayError("forbidden", "this route is for the deployment's operators")
    return caller


OperatorDep = Annotated[Caller, Depends(operator_caller)]


def _policy_out(state: AppState) -> PolicyOut:
    store = state.policies
    serving = store.state()  # one snapshot: a reload meanwhile cannot mix two loads
    current, last = serving.policy, serving.last_reload
    return PolicyOut(
        version=current.version,
        files=list(current.files),
        directory=str(store.directory),
        loaded_at=serving.loaded_at,
        last_reload=None
        if last is None
        else ReloadOut(
            at=last.at, outcome=last.outcome, version=last.version, problems=last.problems
        ),
    )


@admin.get("/policy", response_model=PolicyOut)
async def get_policy(_operator: OperatorDep, state: StateDep) -> PolicyOut:
    return _policy_out(state)


@admin.post(
    "/policy/reload",
    response_model=PolicyOut,
    responses={409: {"model": Problem, "description": "Refused; the previous policy serves"}},
)
async def reload_policy(_operator: OperatorDep, state: StateDep) -> PolicyOut:
    outcome = state.policies.reload()
    if outcome.outcome == "refused":
        raise GatewayError(
            "policy_refused",
            outcome.problems,
            extra={"serving_version": outcome.version},
        )
    reload_everywhere()  # the other processes of this server, if it has any
    return _policy_out(state)


@admin.post(
    "/policy/preview",
    response_model=PolicyPreview,
    responses={
        422: {
            "model": Problem,
            "description": "The edited policy does not load, or is over the preview's bounds",
        },
        429: {"model": Problem, "description": "Your tenant's previews (or all) are running"},
        503: {"model": Problem, "description": "The preview ran past its time limit"},
    },
)
async def preview_policy(
    body: PreviewRequest, admin_caller: AdminDep, policy: PolicyDep, state: StateDep
) -> PolicyPreview:
    """What the edited policy would change for the callers of your tenant, against the
    policy serving now: nothing is applied. Bounded by the serving policy's `preview:`."""
    tenant = admin_caller.tenant
    bounds = policy.policy.preview
    as_of = body.as_of or today_utc()
    check_files(body.files, bounds)  # before anything is parsed or a slot is taken

    def work(deadline: float) -> PolicyDiff:
        edited = load_policy_files(body.files)
        check_policy(edited.policy, bounds)
        versions = state.catalog.visibilities(tenant)
        return diff_policies(policy, edited, versions, as_of, deadline, directory_groups, bounds)

    directory_groups = await asyncio.to_thread(state.catalog.directory.group_names, tenant)

    try:
        diff = await state.previews.run(tenant, bounds, work)
    except DiffTimeout:
        raise GatewayError(
            "preview_timeout",
            f"the preview ran past {bounds.timeout_s:g} s (the serving policy's "
            "preview.timeout_s) and stopped; nothing was applied",
        ) from None
    gained, lost = diff.totals(tenant)
    covered = diff.coverage_of(tenant)
    return PolicyPreview(
        base_version=diff.base_version,
        new_version=diff.new_version,
        as_of=as_of,
        widens=diff.widens_for(tenant),
        gained=gained,
        lost=lost,
        covers=PreviewCoverage(
            documents=covered.documents,
            regions=list(covered.regions),
            groups=covered.groups,
            users=covered.users,
            directory_groups=len(directory_groups),
            notes=list(covered.notes),
        ),
        changes=[
            PreviewChange(
                regions=list(c.regions),
                groups=list(c.groups),
                users=list(c.users),
                gains=list(c.gains),
                losses=list(c.losses),
            )
            for c in diff.changes
        ],
    )


@admin.get("/index", response_model=IndexOut)
async def index_state(
    admin_caller: AdminDep,
    policy: PolicyDep,
    state: StateDep,
    jobs: Annotated[int, Query(ge=0, le=100, description="How many recent jobs")] = 10,
) -> IndexOut:
    """The generation served, your tenant's documents, versions and chunks, its newest
    ingest jobs, and the claim names of the policy that resolved you."""
    tenant = admin_caller.tenant
    served = state.indexes.served
    documents, versions, chunks = await asyncio.to_thread(state.catalog.tenant_counts, tenant)
    recent = await asyncio.to_thread(state.catalog.jobs.recent, tenant, jobs)
    # Only a tenant with a directory needs its user claim (the console offers it to fill).
    directories = await asyncio.to_thread(state.directory.versions.current)
    user_claim = policy.policy.directory.user_claim if tenant in directories else None
    return IndexOut(
        index_generation=served.number if served is not None else None,
        generation_created_at=served.generation.created_at if served is not None else None,
        documents=documents,
        versions=versions,
        chunks=chunks,
        jobs=[job_out(job) for job in recent],
        claims=ClaimNamesOut(**policy.policy.claims.model_dump(), user=user_claim),
    )


@admin.post(
    "/explain",
    response_model=ExplainResponse,
    responses={404: {"model": Problem, "description": "No such document in your tenant"}},
)
async def explain_document(
    body: ExplainRequest,
    admin_caller: AdminDep,
    policy: PolicyDep,
    state: StateDep,
    clock: ClockDep,
) -> ExplainResponse:
    with state.tracing.request("explain", clock, **request_attributes(admin_caller, policy)):
        rows = (
            []
            if no_stored_id(body.doc_id)  # no write made it: no query (gateway.api.ingest)
            else document_versions(state.catalog, body.doc_id, admin_caller.tenant)
        )
        if not rows:
            raise GatewayError("not_found", "no such document")
        as_of = body.as_of or today_utc()
        try:
            # The directory's groups count as they would for this caller; only in the
            # admin's own tenant, so no admin learns another tenant's directory.
            tenant_claim = body.subject.get(policy.policy.claims.tenant)
            directory = (
                await state.directory.resolve(body.subject, policy.policy)
                if tenant_claim == admin_caller.tenant
                else None
            )
            caller = resolve_caller(body.subject, policy.policy, directory)
        except GatewayError as exc:
            if exc.code not in ("insufficient_claims", "account_disabled"):
                raise
            return ExplainResponse(
                doc_id=body.doc_id,
                as_of=as_of,
                visible=False,
                version=None,
                rule=exc.code,
                # Why, as a token with these claims is told: claim names, never their values.
                detail=exc.detail,
                caller=None,
                versions=[],
                policy_version=policy.version,
            )
        found = explain(rows, caller, as_of)
    return ExplainResponse(
        doc_id=found.doc_id,
        as_of=as_of,
        visible=found.visible,
        version=found.deciding.version if found.visible else None,
        rule=found.deciding.decision.rule,
        caller=ExplainCaller(
            subject=caller.subject,
            tenant=caller.tenant,
            region=caller.region,
            principals=sorted(caller.principals),
            readable_regions=sorted(caller.readable_regions),
        ),
        versions=[_version_out(v) for v in found.versions],
        policy_version=policy.version,
    )


def _version_out(v: VersionDecision) -> ExplainVersion:
    return ExplainVersion(
        version=v.version,
        effective_from=v.effective_from,
        effective_to=v.effective_to,
        visible=v.decision.visible,
        rule=v.decision.rule,
        matched_principals=list(v.decision.matched),
        granted_by=v.granted_by,
    )
