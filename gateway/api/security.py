"""The one authentication dependency: bearer token -> verified identity -> Caller.

A bearer is either a JWT from the identity provider or an API key (`gk_...`). The policy
serving as a request arrives is kept on the request (`pinned_policy`): the caller is
resolved under it, and everything else the request decides, and the version it reports,
comes from that one policy even if a reload lands meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gateway.api.state import AppState
from gateway.authn.apikeys import caller_for_key, is_api_key, verify_key
from gateway.authn.tokens import GENERIC_DETAIL
from gateway.domain import MAX_TENANT_BYTES, Caller
from gateway.errors import GatewayError
from gateway.policy.loader import LoadedPolicy
from gateway.policy.resolve import resolve_caller, usable_claim
from gateway.storage.catalog import ApiKeyRow
from gateway.telemetry.audit import note
from gateway.telemetry.stages import StageClock

SCIM_ONLY = "/scim/v2 takes only a key created with --scope scim"
SCIM_KEYS_ONLY = "a scim key may use only /scim/v2"

# auto_error=False: a missing header must become our 401 problem, not FastAPI's 403.
bearer = HTTPBearer(auto_error=False, description="JWT from the identity provider, or gk_ key")


# The dependencies are `async def` though none awaits: FastAPI runs a plain `def`
# dependency in a worker thread, a hop that cost about 0.5 ms each on every request.


def state_of(request: Request) -> AppState:
    state: AppState = request.app.state.gateway
    return state


def clock_of(request: Request) -> StageClock:
    """The stage clock of this request, started by whichever stage asks first."""
    clock: StageClock | None = getattr(request.state, "clock", None)
    if clock is None:
        clock = request.state.clock = StageClock()
    return clock


def pinned_policy(request: Request) -> LoadedPolicy:
    """The policy this request is decided by: the one serving when it was first asked for
    (by the audit guard, as the request arrives), kept on the request. Asked for again, by
    the guard's required records, the caller's resolution or /readyz, it is the same one
    whatever reload landed meanwhile."""
    loaded: LoadedPolicy | None = getattr(request.state, "policy", None)
    if loaded is None:
        loaded = request.state.policy = state_of(request).policy
    return loaded


async def app_state(request: Request) -> AppState:
    return state_of(request)


async def request_clock(request: Request) -> StageClock:
    return clock_of(request)


@dataclass(frozen=True)
class _Authenticated:
    """A caller `authenticate` resolved earlier in this request, and what it was asked."""

    asked: tuple[str, tuple[str, ...], bool]  # the credentials, audiences and `scim`
    caller: Caller


async def authenticate(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None,
    audiences: Sequence[str] = (),
    scim: bool = False,
) -> Caller:
    """The caller a bearer token or key names, resolved under the request's policy
    (`pinned_policy`); a JWT's `aud` may also be one of `audiences` (a route's own resource).
    A `scim` key is refused everywhere but /scim/v2 (`scim=True`). A JWT's caller gains its
    directory groups, and is refused while the directory has it inactive or deleted.
    Neither recorded nor rate-limited: the callers do that (`admit`); only a refusal of a
    verified identity is noted for the audit trail here. Asked again in the same request
    the same way (the audit guard asks before the route does, while records are refused),
    it answers the caller it resolved: the token is verified and the directory asked once."""
    asked = (
        credentials.credentials if credentials is not None else "",
        tuple(audiences),
        scim,
    )
    earlier: _Authenticated | None = getattr(request.state, "authenticated", None)
    if earlier is not None and credentials is not None and earlier.asked == asked:
        return earlier.caller
    caller = await _authenticate(request, credentials, audiences, scim)
    request.state.authenticated = _Authenticated(asked, caller)
    return caller


async def _authenticate(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None,
    audiences: Sequence[str],
    scim: bool,
) -> Caller:
    state = state_of(request)
    clock = clock_of(request)
    loaded = pinned_policy(request)
    with clock.stage("authenticate") as info:
        if credentials is None or credentials.scheme.lower() != "bearer":
            raise GatewayError("unauthenticated", GENERIC_DETAIL)
        token = credentials.credentials
        info.update(kind="api_key" if is_api_key(token) else "jwt")
        identity: ApiKeyRow | dict[str, Any] = (
            verify_key(state.catalog, token)
            if is_api_key(token)
            else await state.verifier.verify(token, audiences)
        )
        if isinstance(identity, dict):  # verified claims: /mcp reads `aud` and `scope`
            request.state.token_claims = identity
        with _refusal_noted(identity, loaded):
            if scim and not isinstance(identity, ApiKeyRow):
                raise GatewayError("forbidden", SCIM_ONLY)
            if isinstance(identity, ApiKeyRow) and (identity.scope == "scim") != scim:
                # Either way round: a directory key provisions only, and nothing else does.
                raise GatewayError("forbidden", SCIM_ONLY if scim else SCIM_KEYS_ONLY)
    with (
        clock.stage("resolve", policy_version=loaded.version) as info,
        _refusal_noted(identity, loaded),
    ):
        if isinstance(identity, ApiKeyRow):
            caller = caller_for_key(identity, loaded.policy)
        else:
            try:
                directory = await state.directory.resolve(identity, loaded.policy)
            except GatewayError as exc:
                if exc.code == "insufficient_claims":  # no directory user named
                    state.metrics.directory_unnamed.inc()
                raise
            caller = resolve_caller(identity, loaded.policy, directory)
        info.update(principals=len(caller.principals), rules=list(caller.reasons))
    return caller


@contextmanager
def _refusal_noted(identity: ApiKeyRow | dict[str, Any], loaded: LoadedPolicy) -> Iterator[None]:
    """An error inside (a 403: forbidden, insufficient_claims, account_disabled; or the
    directory's database away) noted with whom it answered, so that the audit middleware
    records it with its status: refusing a verified caller is a decision, on record like
    any other. A 401 has no "who" to note; a token without a usable `sub` or `tenant` can
    be filed under no tenant either."""
    try:
        yield
    except GatewayError:
        if isinstance(identity, ApiKeyRow):
            subject: str | None = f"key:{identity.key_id}"
            tenant: str | None = identity.tenant
        else:
            names = loaded.policy.claims
            subject = usable_claim(identity, names.subject)
            tenant = usable_claim(identity, names.tenant, MAX_TENANT_BYTES)
        note(subject=subject, tenant=tenant, policy_version=loaded.version)
        raise


def admit(request: Request, caller: Caller) -> None:
    """Record who asks under which policy, then spend one of the caller's requests (429
    `rate_limited` when none is left)."""
    state = state_of(request)
    loaded: LoadedPolicy = request.state.policy
    note(subject=caller.subject, tenant=caller.tenant, policy_version=loaded.version)
    try:
        state.limiter.admit(caller, loaded.policy.limits)
    except GatewayError as exc:
        if exc.code == "rate_limited":  # not a 503 of the shared limits' file
            state.metrics.rate_limited.inc()
        raise


async def authenticated_caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Caller:
    # Requests with a body were authenticated before it was read (gateway.api.limits).
    known: Caller | None = getattr(request.state, "caller", None)
    if known is not None:
        if known.scope == "scim":  # checked again here, whoever authenticated it
            raise GatewayError("forbidden", SCIM_KEYS_ONLY)
        return known
    caller = await authenticate(request, credentials)
    admit(request, caller)
    return caller


async def scim_caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Caller:
    """/scim/v2: a `scim` key only, which reaches nothing else (docs/security.md,
    "Directory keys provision and do nothing else")."""
    known: Caller | None = getattr(request.state, "caller", None)
    if known is not None:
        # Checked again here: only a `scim` key's caller reaches the directory, whichever
        # dependency authenticated it first.
        if known.scope != "scim":
            raise GatewayError("forbidden", SCIM_ONLY)
        return known
    caller = await authenticate(request, credentials, scim=True)
    admit(request, caller)
    return caller


async def request_policy(request: Request, _caller: CallerDep) -> LoadedPolicy:
    """The policy that resolved this request's caller."""
    loaded: LoadedPolicy = request.state.policy
    return loaded


async def reading_caller(caller: CallerDep) -> Caller:
    """The read routes: anyone authenticated, but not an ingest key (it writes only)."""
    if caller.scope == "ingest":
        raise GatewayError("forbidden", "an ingest key may use only the ingest routes")
    return caller


async def admin_caller(caller: CallerDep) -> Caller:
    if not caller.admin:
        raise GatewayError("forbidden", "this route is for policy admins")
    return caller


CallerDep = Annotated[Caller, Depends(authenticated_caller)]
AdminDep = Annotated[Caller, Depends(admin_caller)]
PolicyDep = Annotated[LoadedPolicy, Depends(request_policy)]
StateDep = Annotated[AppState, Depends(app_state)]
ClockDep = Annotated[StageClock, Depends(request_clock)]
