"""A fake OIDC issuer at the HTTP transport, a fake clock, and settings for a bare
`TokenVerifier` (the token tests drive the verifier without an app)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import httpx

from gateway.settings import Settings
from tests.helpers.identity import AUDIENCE, ISSUER, LEEWAY

DISCOVERY_PATH = "/.well-known/openid-configuration"
JWKS_PATH = "/keys"
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def verifier_settings(jwks_uri: str = "", **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "oidc_issuer": ISSUER,
        "oidc_audience": AUDIENCE,
        "jwks_uri": jwks_uri,
        "jwt_leeway_s": LEEWAY,
        "jwks_refresh_min_interval_s": 30.0,
    }
    values.update(overrides)
    return Settings(**values)


class FakeIssuer:
    """An OIDC issuer behind httpx.MockTransport that records every request path."""

    def __init__(self, jwks: dict[str, Any], status: int = 200) -> None:
        self.jwks = jwks
        self.status = status
        self.jwks_uri = ISSUER + JWKS_PATH  # what the discovery document names
        self.paths: list[str] = []
        self.transport = httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        await asyncio.sleep(0.01)  # a real round trip yields, letting other requests interleave
        if self.status != 200:
            return httpx.Response(self.status)
        if request.url.path == DISCOVERY_PATH:
            return httpx.Response(200, json={"issuer": ISSUER, "jwks_uri": self.jwks_uri})
        if request.url.path == JWKS_PATH:
            return httpx.Response(200, json=self.jwks)
        return httpx.Response(404)

    @property
    def jwks_fetches(self) -> int:
        return self.paths.count(JWKS_PATH)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
