"""The console's page loads share one look-up of the issuer's token endpoint: many first
loads at once (a team opening the console after a deploy) each fetched the discovery
document. The issuer is faked at the HTTP transport, as the verifier's tests do."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.settings import Settings
from tests.helpers.idp import CONSOLE_CLIENT_ID

ISSUER = "https://accounts.example"
LOADS = 8


def test_concurrent_first_page_loads_fetch_the_discovery_document_once(
    tmp_path: Path, jwks_file: Path, embedder: Embedder
) -> None:
    discovery = {"issuer": ISSUER, "token_endpoint": "https://oauth2.example/token"}
    asked: list[str] = []

    async def provider(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        await asyncio.sleep(0.3)  # a slow provider: the other loads arrive meanwhile
        return httpx.Response(200, json=discovery)

    settings = Settings(
        data_dir=tmp_path / "data",
        oidc_issuer=ISSUER,
        oidc_audience="gateway",
        jwks_uri=jwks_file.as_uri(),
        console_client_id=CONSOLE_CLIENT_ID,
    )
    app = create_app(settings, embedder=embedder, transport=httpx.MockTransport(provider))
    with TestClient(app) as client, ThreadPoolExecutor(LOADS) as pool:
        pages = list(pool.map(lambda _: client.get("/console"), range(LOADS)))
    for page in pages:
        assert page.status_code == 200
        assert (
            "connect-src 'self' https://accounts.example https://oauth2.example;"
            in (page.headers["content-security-policy"])
        )
    assert asked == [f"{ISSUER}/.well-known/openid-configuration"]
