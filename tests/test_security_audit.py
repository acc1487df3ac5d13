"""The authentication dependency over HTTP. Refusals of an identified caller are decisions,
on record like any other: the audit trail holds them with their 403 (DESIGN invariant 15);
a 401 has no "who" to record. An issuer whose keys cannot be loaded is a 503 to retry."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.authn.apikeys import create_key
from gateway.embedding import Embedder
from gateway.storage.audit import AuditRow
from gateway.storage.layout import DataLayout
from tests.helpers.datadirs import copy_data_dir
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.mcp import HEADERS, rpc
from tests.helpers.policies import write_policy
from tests.helpers.scim import Scim, scim_key


def on_record(client: TestClient, tenant: str, subject: str) -> list[tuple[str, int]]:
    """(route, status) of the subject's records, oldest first. The record is queued once
    the response is sent, which the TestClient waits for; `flush` writes it now."""
    state = client.app.state.gateway  # type: ignore[attr-defined]
    assert state.audit.flush()
    rows: list[AuditRow] = state.catalog.audit.find(tenant, subject=subject)
    return [(row.route, row.status) for row in reversed(rows)]


def someone() -> str:
    return f"user-{secrets.token_hex(4)}"  # a subject no other test's records share


def refused(response: Any, code: str) -> None:
    assert response.status_code == 403, response.text
    assert response.json()["code"] == code


def test_a_scim_key_refused_off_the_directory_is_on_record(
    app: tuple[TestClient, DataLayout],
) -> None:
    client, layout = app
    key, row = create_key(
        layout.open_catalog(), tenant="acme", region="", principals=[], scope="scim"
    )
    refused(client.get("/documents/refund-policy", headers=bearer(key)), "forbidden")
    # A request with a body is authenticated before it is read (RequestGuard).
    refused(client.post("/search", json={"query": "refunds"}, headers=bearer(key)), "forbidden")
    assert on_record(client, "acme", f"key:{row.key_id}") == [
        ("/documents/{doc_id}", 403),
        ("/search", 403),
    ]


def test_a_token_refused_at_the_directory_routes_is_on_record(
    app: tuple[TestClient, DataLayout], make_token: TokenFactory
) -> None:
    client, _ = app
    sub = someone()
    response = client.get("/scim/v2/Users", headers=bearer(make_token(sub=sub)))
    assert response.status_code == 403, response.text
    assert on_record(client, "acme", sub) == [("/scim/v2/Users", 403)]


def test_a_disabled_directory_user_is_refused_on_record(
    app: tuple[TestClient, DataLayout], make_token: TokenFactory
) -> None:
    client, layout = app
    sub = someone()
    Scim(client, scim_key(layout, "acme")).user(sub, active=False)
    response = client.get("/documents/refund-policy", headers=bearer(make_token(sub=sub)))
    refused(response, "account_disabled")
    assert on_record(client, "acme", sub) == [("/documents/{doc_id}", 403)]


def test_a_token_lacking_a_claim_is_refused_on_record_under_its_tenant(
    app: tuple[TestClient, DataLayout], make_token: TokenFactory
) -> None:
    client, _ = app
    sub = someone()
    response = client.get(
        "/documents/refund-policy", headers=bearer(make_token(sub=sub, region=None))
    )
    refused(response, "insufficient_claims")
    assert response.json()["detail"] == "missing or unusable claims: region"
    assert on_record(client, "acme", sub) == [("/documents/{doc_id}", 403)]


@pytest.mark.parametrize("tenant", [123, ["acme"], "", "acme\nx"], ids=repr)
def test_an_unusable_tenant_claim_is_not_called_missing(
    app: tuple[TestClient, DataLayout], make_token: TokenFactory, tenant: Any
) -> None:
    client, _ = app
    response = client.get("/documents/refund-policy", headers=bearer(make_token(tenant=tenant)))
    refused(response, "insufficient_claims")
    assert response.json()["detail"] == "missing or unusable claims: tenant"


def test_a_caller_refused_at_mcp_for_its_scope_is_on_record(
    tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    """/mcp's 403 `insufficient_scope` (an ingest key; a token for the MCP resource without
    the scope `search`) left no record, where /search records the same key's 403."""
    data = copy_data_dir(data_dir, tmp_path / "data")
    settings = make_settings(data, jwks_file, write_policy(tmp_path / "policy"))
    settings = settings.model_copy(update={"public_url": "http://testserver"})
    sub = someone()
    unscoped = make_token(sub=sub, groups=["staff"], aud="http://testserver/mcp")
    call = rpc("tools/call", {"name": "search", "arguments": {"query": "refunds"}})
    with TestClient(create_app(settings, embedder=embedder)) as client:
        key, row = create_key(
            DataLayout(data).open_catalog(),
            tenant="acme",
            region="EU",
            principals=[],
            scope="ingest",
        )
        for credential in (key, unscoped):
            refused(
                client.post("/mcp", json=call, headers={**HEADERS, **bearer(credential)}),
                "forbidden",
            )
        refused(client.post("/search", json={"query": "refunds"}, headers=bearer(key)), "forbidden")
        assert on_record(client, "acme", f"key:{row.key_id}") == [("/mcp", 403), ("/search", 403)]
        assert on_record(client, "acme", sub) == [("/mcp", 403)]
        state = client.app.state.gateway  # type: ignore[attr-defined]
        (record,) = state.catalog.audit.find("acme", subject=sub)
        assert record.policy_version == state.policy.version


def test_an_unauthenticated_request_leaves_no_record(app: tuple[TestClient, DataLayout]) -> None:
    client, _ = app
    state = client.app.state.gateway  # type: ignore[attr-defined]
    assert state.audit.flush()
    before = state.audit.pending
    response = client.get("/documents/refund-policy", headers=bearer("gk_0123456789abcdef_x"))
    assert response.status_code == 401
    assert state.audit.pending == before  # nothing queued: a 401 names nobody


def test_a_token_while_the_issuers_keys_cannot_be_loaded_is_503_with_retry_after(
    tmp_path: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    """Not a 401: the token may well be good, and a client told 401 throws it away."""
    settings = make_settings(tmp_path / "data", tmp_path / "no-jwks-yet.json")
    with TestClient(create_app(settings, embedder=embedder)) as client:
        token = make_token()
        for response in (
            client.get("/documents/refund-policy", headers=bearer(token)),
            client.post("/search", json={"query": "refunds"}, headers=bearer(token)),
        ):
            assert response.status_code == 503, response.text
            assert response.json()["code"] == "not_ready"
            assert "signing keys" in response.json()["detail"]
            assert 1 <= int(response.headers["Retry-After"]) <= 30
        garbage = client.get("/documents/refund-policy", headers=bearer("not-a-token"))
        assert garbage.status_code == 401  # a token that cannot be good is still refused
