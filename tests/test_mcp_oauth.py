"""OAuth for MCP end to end, with the official `mcp` SDK's OAuth client provider against a
real OpenID provider (npm `oidc-provider` over TLS on loopback) and a real `gateway serve`:
the client meets 401 at /mcp, follows `resource_metadata` to our RFC 9728 document, reads
the provider's metadata, registers itself dynamically, signs the user in with PKCE (the
provider's own login and consent pages, driven over HTTP) and gets a JWT bound to the
resource <public URL>/mcp (RFC 8707). `search` then runs as that user, restricted to what
they may see. A token the same provider issued for another resource is refused (401
invalid_token), and one for our resource without the scope `search` is 403
insufficient_scope, the challenge naming the scope.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)

from gateway.authn.tokens import TokenVerifier
from gateway.bench.server import free_port
from gateway.errors import GatewayError
from gateway.settings import Settings
from tests.helpers.identity import bearer
from tests.helpers.idp import Idp, make_ca_and_certificate, running_idp
from tests.helpers.policies import write_policy
from tests.helpers.processes import gateway_env, running_server

pytestmark = pytest.mark.server

AUDIENCE = "https://gateway.test/api"
QUERY = "merchant fraud chargeback thresholds"
HEADERS = {"Accept": "application/json, text/event-stream"}


@pytest.fixture(scope="module")
def served(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Idp]]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with running_idp() as idp:
        env = gateway_env(
            GATEWAY_DATA_DIR=str(data_dir),
            GATEWAY_POLICY_DIR=str(write_policy(tmp_path_factory.mktemp("mcp-oauth-policy"))),
            GATEWAY_OIDC_ISSUER=idp.issuer,
            GATEWAY_OIDC_AUDIENCE=AUDIENCE,
            GATEWAY_OIDC_CA_FILE=str(idp.ca_file),
            GATEWAY_PUBLIC_URL=base,
        )
        with running_server(env, port=port) as (started, _process):
            yield started, idp


class MemoryStorage:
    """The SDK's TokenStorage, in memory: what the client registered and was given."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


def payload(token: str) -> dict[str, Any]:
    part = token.split(".")[1]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    return decoded


async def search_as(base: str, idp: Idp, user: str) -> tuple[Any, MemoryStorage, list[str]]:
    """`search` through the SDK's client, signing `user` in when the gateway asks."""
    redirect_uri = f"http://127.0.0.1:{free_port()}/callback"  # never listened on: read here
    storage, visited, answers = MemoryStorage(), [], []

    async def redirect_handler(authorize_url: str) -> None:
        visited.append(authorize_url)
        answers.append(await asyncio.to_thread(idp.sign_in, authorize_url, redirect_uri, user))

    async def callback_handler() -> AuthorizationCodeResult:
        query = {k: v[0] for k, v in parse_qs(urlsplit(answers.pop()).query).items()}
        return AuthorizationCodeResult(
            code=query["code"], state=query.get("state"), iss=query.get("iss")
        )

    metadata = OAuthClientMetadata(
        client_name="gateway test agent",
        redirect_uris=[redirect_uri],  # type: ignore[list-item]
        token_endpoint_auth_method="none",  # a public client, as MCP clients are
        grant_types=["authorization_code"],
    )
    oauth = OAuthClientProvider(
        f"{base}/mcp", metadata, storage, redirect_handler, callback_handler
    )
    trust = ssl.create_default_context(cafile=str(idp.ca_file))  # the provider's CA
    async with (
        httpx2.AsyncClient(auth=oauth, verify=trust, timeout=60) as http,
        Client(streamable_http_client(f"{base}/mcp", http_client=http)) as client,
    ):
        result = await client.call_tool("search", {"query": QUERY, "top_k": 10})
    return result, storage, visited


def test_the_sdk_signs_in_by_oauth_and_searches_as_that_user(served: tuple[str, Idp]) -> None:
    base, idp = served
    result, storage, visited = asyncio.run(search_as(base, idp, "bob"))
    assert result.is_error is False
    assert "merchant-fraud" in {r["doc_id"] for r in result.structured_content["results"]}

    # Registered dynamically, signed in with PKCE S256, asked for our resource.
    assert storage.client is not None and storage.client.client_id
    asked = parse_qs(urlsplit(visited[0]).query)
    assert asked["code_challenge_method"] == ["S256"] and asked["code_challenge"]
    assert asked["resource"] == [f"{base}/mcp"] and "search" in asked["scope"][0].split()
    assert storage.tokens is not None
    claims = payload(storage.tokens.access_token)
    assert claims["aud"] == f"{base}/mcp" and claims["iss"] == idp.issuer
    assert claims["sub"] == "bob" and "search" in claims["scope"].split()

    # The same flow as alice, who does not hold merchant-risk: restricted to what she sees.
    result, _, _ = asyncio.run(search_as(base, idp, "alice"))
    assert result.is_error is False and result.structured_content["results"]
    assert "merchant-fraud" not in {r["doc_id"] for r in result.structured_content["results"]}


def rpc_tools_list(base: str, token: str) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    return httpx.post(f"{base}/mcp", json=body, headers={**HEADERS, **bearer(token)})


def test_a_token_for_another_resource_is_refused(served: tuple[str, Idp]) -> None:
    base, idp = served
    assert rpc_tools_list(base, idp.service_token(f"{base}/mcp")).status_code == 200
    refused = rpc_tools_list(base, idp.service_token("https://elsewhere.example/mcp"))
    assert refused.status_code == 401
    challenge = refused.headers["www-authenticate"]
    assert 'error="invalid_token"' in challenge
    assert f'resource_metadata="{base}/.well-known/oauth-protected-resource/mcp"' in challenge


def test_a_token_without_the_scope_is_403_naming_it(served: tuple[str, Idp]) -> None:
    base, idp = served
    token = idp.service_token(f"{base}/mcp", scope="")
    assert "search" not in payload(token).get("scope", "").split()
    refused = rpc_tools_list(base, token)
    assert refused.status_code == 403
    challenge = refused.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge and 'scope="search"' in challenge
    document = httpx.get(f"{base}/.well-known/oauth-protected-resource/mcp").json()
    assert document["scopes_supported"] == ["search"]
    assert document["authorization_servers"] == [idp.issuer]


def test_the_providers_certificate_is_checked_against_the_configured_ca(
    served: tuple[str, Idp], tmp_path: Path
) -> None:
    """Keys come over https only, and only from a certificate the configured CAs signed:
    the system's store does not know the test's CA, and another CA is not enough."""
    _, idp = served
    token = idp.service_token(AUDIENCE)
    other_ca, _, _ = make_ca_and_certificate(tmp_path)

    async def verify(**ca: Any) -> bool:
        settings = Settings(oidc_issuer=idp.issuer, oidc_audience=AUDIENCE, **ca)
        verifier = TokenVerifier(settings)
        try:
            await verifier.verify(token)
            return True
        except GatewayError:
            return False
        finally:
            await verifier.aclose()

    assert asyncio.run(verify(oidc_ca_file=idp.ca_file)) is True
    assert asyncio.run(verify()) is False
    assert asyncio.run(verify(oidc_ca_file=other_ca)) is False
