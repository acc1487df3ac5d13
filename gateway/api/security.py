"""The one authentication dependency: bearer token -> verified claims -> Caller."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gateway.api.state import AppState
from gateway.domain import Caller
from gateway.errors import GatewayError
from gateway.policy.resolve import resolve_caller

# auto_error=False: a missing header must become our 401 problem, not FastAPI's 403.
bearer = HTTPBearer(auto_error=False, description="JWT from the identity provider")


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.gateway
    return state


async def authenticated_caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Caller:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise GatewayError("unauthenticated", "invalid or missing bearer token")
    state = app_state(request)
    claims = await state.verifier.verify(credentials.credentials)
    caller = resolve_caller(claims, state.policy.policy)
    request.state.subject = caller.subject  # for logs: the ID, never the token
    return caller


CallerDep = Annotated[Caller, Depends(authenticated_caller)]
StateDep = Annotated[AppState, Depends(app_state)]
