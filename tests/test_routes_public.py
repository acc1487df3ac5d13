"""Every route is authenticated or explicitly public (invariant 10)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from gateway.api.limits import SELF_AUTHENTICATING
from gateway.api.mcp import McpEndpoint
from gateway.api.routes import PUBLIC_PATHS
from gateway.api.security import authenticated_caller, scim_caller
from tests.helpers.identity import TokenFactory, bearer


def _depends_on_auth(route: APIRoute) -> bool:
    pending = list(route.dependant.dependencies)
    while pending:
        dependant = pending.pop()
        # /scim/v2 takes scim keys only, through the same `authenticate` (tests/test_scim.py)
        if dependant.call is authenticated_caller or dependant.call is scim_caller:
            return True
        pending.extend(dependant.dependencies)
    return False


def _served_routes(routes: list[Any]) -> Iterator[Any]:
    """Every route the app serves, including those inside included routers."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from _served_routes(list(inner.routes))
        else:
            yield route


def test_every_route_is_authenticated_or_public(client: TestClient) -> None:
    seen = set()
    for route in _served_routes(client.app.routes):  # type: ignore[attr-defined]
        path = getattr(route, "path", "")
        seen.add(path)
        if path in PUBLIC_PATHS:
            continue
        if path in SELF_AUTHENTICATING:  # its own challenge: tests/test_mcp.py
            assert isinstance(route.endpoint, McpEndpoint), path
            continue
        assert isinstance(route, APIRoute), f"unexpected non-API route {path}"
        assert _depends_on_auth(route), f"{path} is neither public nor authenticated"
    assert {"/search", "/mcp", "/v1/chat/completions", "/scim/v2/Users"} <= seen


def test_unknown_route_is_a_404_problem(client: TestClient) -> None:
    response = client.get("/nope")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/problem+json")


def test_openapi_is_public(client: TestClient) -> None:
    response = client.get("/openapi.json")  # no credentials
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.")
    assert {"/search", "/answer", "/healthz"} <= set(document["paths"])


def test_a_trailing_slash_is_an_unknown_path_not_a_redirect(
    client: TestClient, make_token: TokenFactory
) -> None:
    """`/search/` is not `/search`: a 307 there made a client that followed it pay the
    rate limit twice for one search, with an answer no route records."""
    auth = bearer(make_token())
    for method, path in (("POST", "/search/"), ("GET", "/healthz/"), ("GET", "/documents/x/")):
        response = client.request(
            method, path, json={"query": "refund"}, headers=auth, follow_redirects=False
        )
        assert response.status_code == 404, path
        assert response.headers["content-type"].startswith("application/problem+json")
        assert "location" not in response.headers
