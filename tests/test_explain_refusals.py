"""Explain says why claims are refused, as a token with them is told: under a directory
matched on a claim of its own (`directory: {user_claim: oid, ...}`, the documented Entra
setup), claims without `oid` got `rule: insufficient_claims` and nothing else, and the
console blamed the subject, tenant or region, while a real token got 403 "this tenant has
a directory: the token must carry its user claim (oid)". GET /admin/index names that
claim, for the console to ask for it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from gateway.embedding import Embedder
from tests.helpers.documents import doc
from tests.helpers.identity import TokenFactory, bearer
from tests.helpers.push_app import push_app
from tests.helpers.scim import Scim, scim_key

ENTRA = {"user_claim": "oid", "user_attribute": "externalId"}
# An admin of acme (ops nests in gateway-admins); a directory tenant's token carries oid.
ADMIN: dict[str, Any] = {"sub": "root", "groups": ["ops", "staff"], "oid": "oid-root"}


@pytest.fixture
def directory(
    tmp_path: Path, embedder: Embedder, jwks_file: Path, make_token: TokenFactory
) -> Iterator[tuple[TestClient, Scim]]:
    """acme under the Entra setup, with a directory (SCIM) and an `otter` document that
    its directory group risk-team reads."""
    with push_app(tmp_path, embedder, jwks_file) as (client, writer, key):
        policy_file = tmp_path / "policy" / "policy.yaml"  # push_app's policy
        policy = yaml.safe_load(policy_file.read_text())
        policy_file.write_text(yaml.safe_dump({**policy, "directory": ENTRA}))
        reloaded = client.post("/admin/policy/reload", headers=bearer(make_token(**ADMIN)))
        assert reloaded.status_code == 200, reloaded.text
        otter = doc("otter", text="The otter pond budget is OPB-55 euros.", acl=["group:risk-team"])
        pushed = client.post("/admin/documents", json={"documents": [otter]}, headers=bearer(key))
        assert pushed.status_code == 202, pushed.text
        assert writer.run_once() == 1
        yield client, Scim(client, scim_key(writer.layout, "acme"))


def explain(client: TestClient, token: str, claims: dict[str, Any]) -> dict[str, Any]:
    body = {"subject": claims, "doc_id": "otter"}
    response = client.post("/admin/explain", json=body, headers=bearer(token))
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_explain_gives_the_refusals_detail_a_token_with_those_claims_gets(
    directory: tuple[TestClient, Scim], make_token: TokenFactory
) -> None:
    client, scim = directory
    dora = scim.user("dora@acme.test", externalId="oid-dora")
    scim.group("risk-team", dora)
    admin = make_token(**ADMIN)

    index = client.get("/admin/index", headers=bearer(admin))
    assert index.status_code == 200, index.text
    assert index.json()["claims"] == {
        "subject": "sub",
        "tenant": "tenant",
        "region": "region",
        "groups": "groups",
        "user": "oid",
    }

    # Claims without the directory's user claim: what a real token of them is told.
    claims = {"sub": "dora", "tenant": "acme", "region": "EU", "groups": []}
    refused = client.post("/search", json={"query": "otter"}, headers=bearer(make_token(**claims)))
    assert refused.status_code == 403 and refused.json()["code"] == "insufficient_claims"
    explained = explain(client, admin, claims)
    assert (explained["visible"], explained["rule"], explained["caller"]) == (
        False,
        "insufficient_claims",
        None,
    )
    assert explained["detail"] == refused.json()["detail"]
    assert (
        explained["detail"]
        == "this tenant has a directory: the token must carry its user claim (oid)"
    )

    # With it, the directory's group decides, and there is no refusal to explain.
    explained = explain(client, admin, {**claims, "oid": "oid-dora"})
    assert (explained["visible"], explained["rule"], explained["detail"]) == (True, "acl", None)
    assert explained["versions"][0]["granted_by"] == {"group:risk-team": "directory"}

    # A deactivated user: the reason, and no more of the person than a token is told.
    scim.patch(f"/Users/{dora}", {"op": "replace", "value": {"active": False}})
    explained = explain(client, admin, {**claims, "oid": "oid-dora"})
    assert (explained["rule"], explained["detail"]) == (
        "account_disabled",
        "this account is disabled in the directory",
    )


def test_the_detail_names_claims_never_their_values(
    directory: tuple[TestClient, Scim], make_token: TokenFactory
) -> None:
    client, _ = directory
    secret = "SECRET-TENANT-" + "x" * 300  # a usable string, too long for a tenant
    claims = {"sub": 42, "tenant": secret, "groups": [], "oid": "oid-x"}
    explained = explain(client, make_token(**ADMIN), claims)
    assert explained["rule"] == "insufficient_claims"
    assert explained["detail"] == (
        "missing or unusable claims: sub, tenant (314 bytes in UTF-8; the limit is 256), region"
    )
    assert "SECRET" not in str(explained) and "42" not in explained["detail"]
