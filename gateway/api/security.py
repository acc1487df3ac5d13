"""The one authentication dependency: bearer token -> verified claims -> Caller."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gateway.api.state import AppState
from gateway.domain import Caller
from gateway.errors import GatewayError
from gateway.policy.resolve import resolve_caller
from gateway.telemetry.stages import StageClock

# auto_error=False: a missing header must become our 401 problem, not FastAPI's 403.
bearer = HTTPBearer(auto_error=False, description="JWT from the identity provider")


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.gateway
    return state


def request_clock(request: Request) -> StageClock:
    """The stage clock of this request, started by whichever stage asks first."""
    clock: StageClock | None = getattr(request.state, "clock", None)
    if clock is None:
        clock = request.state.clock = StageClock()
    return clock


async def authenticated_caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Caller:
    state = app_state(request)
    clock = request_clock(request)
    with clock.stage("authenticate"):
        if credentials is None or credentials.scheme.lower() != "bearer":
            raise GatewayError("unauthenticated", "invalid or missing bearer token")
        claims = await state.verifier.verify(credentials.credentials)
    with clock.stage("resolve", policy_version=state.policy.version) as info:
        caller = resolve_caller(claims, state.policy.policy)
        info.update(principals=len(caller.principals), rules=list(caller.reasons))
    return caller


CallerDep = Annotated[Caller, Depends(authenticated_caller)]
StateDep = Annotated[AppState, Depends(app_state)]
ClockDep = Annotated[StageClock, Depends(request_clock)]
