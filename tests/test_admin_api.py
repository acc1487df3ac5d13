"""Admin routes: policy state and reload while serving, and explanations that match search."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.embedding import Embedder
from tests.helpers.callers import ALICE, BOB, EVE, ROOT
from tests.helpers.documents import day
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.policies import write_policy


@pytest.fixture
def admin_client(
    tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder
) -> Iterator[tuple[TestClient, Path]]:
    policy_dir = write_policy(tmp_path / "policy")
    settings = make_settings(data_dir, jwks_file, policy_dir).model_copy(
        update={"policy_watch_interval_s": 0.0}
    )
    with TestClient(create_app(settings, embedder=embedder)) as client:
        yield client, policy_dir


def test_admin_routes_refuse_non_admins(
    admin_client: tuple[TestClient, Path], make_token: TokenFactory
) -> None:
    client, _ = admin_client
    for method, path in (
        ("GET", "/admin/policy"),
        ("POST", "/admin/policy/reload"),
        ("POST", "/admin/explain"),
    ):
        body = {"subject": {}, "doc_id": "refund-policy"} if path.endswith("explain") else None
        anonymous = client.request(method, path, json=body)
        assert anonymous.status_code == 401
        # A token cannot make itself an admin: claims name no admin rights, groups do.
        for claims in (ALICE, {**ALICE, "admin": True, "roles": ["admin"]}):
            response = client.request(method, path, json=body, headers=bearer(make_token(**claims)))
            assert response.status_code == 403
            assert response.headers["content-type"].startswith("application/problem+json")


def test_policy_state_and_version_everywhere(
    admin_client: tuple[TestClient, Path], make_token: TokenFactory
) -> None:
    client, _ = admin_client
    state = client.get("/admin/policy", headers=bearer(make_token(**ROOT)))
    assert state.status_code == 200
    version = state.json()["version"]
    assert state.json()["files"] == ["policy.yaml"] and state.json()["last_reload"] is None
    searched = client.post("/search", json={"query": "refund"}, headers=bearer(make_token()))
    assert searched.json()["policy_version"] == version
    for response in (
        state,
        searched,
        client.get("/healthz"),
        client.get("/documents/nope", headers=bearer(make_token())),
        client.post("/search", json={"query": "x"}),  # refused token, still versioned
    ):
        assert response.headers["gateway-policy-version"] == version


def test_reload_serves_a_new_policy_and_refuses_a_broken_one(
    admin_client: tuple[TestClient, Path],
    make_token: TokenFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client, policy_dir = admin_client
    admin = bearer(make_token(**ROOT))
    before = client.get("/admin/policy", headers=admin).json()["version"]
    # Widening takes effect on reload: US documents become readable from EU.
    us_query = {"query": "Thanksgiving closing hours USR-5150"}
    assert "us-holidays" not in str(client.post("/search", json=us_query, headers=admin).json())
    write_policy(policy_dir, regions={"also_reads": {"EU": ["US"]}})
    reloaded = client.post("/admin/policy/reload", headers=admin)
    assert reloaded.status_code == 200 and reloaded.json()["last_reload"]["outcome"] == "loaded"
    good = reloaded.json()["version"]
    assert good != before
    widened = client.post("/search", json=us_query, headers=admin).json()
    assert widened["policy_version"] == good
    assert widened["results"][0]["doc_id"] == "us-holidays"

    (policy_dir / "policy.yaml").write_text("regions: {global_readable: maybe}\nbypass: true\n")
    with caplog.at_level(logging.ERROR, logger="gateway.policy"):
        refused = client.post("/admin/policy/reload", headers=admin)
    assert refused.status_code == 409
    problem = refused.json()
    assert problem["code"] == "policy_refused" and problem["serving_version"] == good
    assert "policy.yaml" in problem["detail"] and "regions.global_readable" in problem["detail"]
    assert "bypass" in problem["detail"]
    assert any("refused" in r.getMessage() for r in caplog.records)
    metrics = client.get("/metrics").text  # and an alert can fire on it
    assert 'gateway_policy_reloads_total{outcome="refused"} 1.0' in metrics
    assert 'gateway_policy_reloads_total{outcome="loaded"} 1.0' in metrics
    state = client.get("/admin/policy", headers=admin).json()
    assert state["version"] == good
    assert (
        state["last_reload"]["outcome"] == "refused"
        and "bypass" in state["last_reload"]["problems"]
    )
    still = client.post("/search", json=us_query, headers=admin).json()
    assert still["policy_version"] == good and still["results"][0]["doc_id"] == "us-holidays"


def test_policy_files_are_watched(
    tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    policy_dir = write_policy(tmp_path / "watched")
    settings = make_settings(data_dir, jwks_file, policy_dir).model_copy(
        update={"policy_watch_interval_s": 0.05}
    )
    with TestClient(create_app(settings, embedder=embedder)) as client:
        admin = bearer(make_token(**ROOT))
        before = client.get("/admin/policy", headers=admin).json()["version"]
        write_policy(policy_dir, retrieval={"candidates_per_lane": 40, "rrf_k": 60})
        deadline = time.monotonic() + 10
        state = client.get("/admin/policy", headers=admin).json()
        while state["version"] == before and time.monotonic() < deadline:
            time.sleep(0.05)
            state = client.get("/admin/policy", headers=admin).json()
        assert state["version"] != before and state["last_reload"]["outcome"] == "loaded"


def explain(client: TestClient, token: str, subject: dict[str, Any], doc_id: str) -> Any:
    return client.post(
        "/admin/explain", json={"subject": subject, "doc_id": doc_id}, headers=bearer(token)
    )


def claims_of(sub: str, **extra: Any) -> dict[str, Any]:
    return {"sub": sub, "tenant": "acme", "region": "EU", "groups": ["staff"], **extra}


@pytest.mark.parametrize(
    ("subject", "doc_id", "visible", "rule", "version"),
    [
        (claims_of("alice"), "refund-policy", True, "acl", "2"),
        (claims_of("alice"), "merchant-fraud", False, "acl", None),
        (claims_of("bob", groups=["risk-eu"]), "merchant-fraud", True, "acl", "1"),
        (claims_of("carol", region="US"), "refund-policy", False, "region", None),
        (claims_of("dave", tenant="globex"), "refund-policy", False, "tenant", None),
        (claims_of("alice"), "ended-yesterday", False, "effective_to", None),
        (claims_of("alice"), "loyalty", True, "acl", "1"),
        ({"sub": "nobody-knows"}, "refund-policy", False, "insufficient_claims", None),
    ],
)
def test_explain_names_the_deciding_rule(
    admin_client: tuple[TestClient, Path],
    make_token: TokenFactory,
    subject: dict[str, Any],
    doc_id: str,
    visible: bool,
    rule: str,
    version: str | None,
) -> None:
    client, _ = admin_client
    response = explain(client, make_token(**ROOT), subject, doc_id)
    assert response.status_code == 200, response.text
    payload = response.json()
    assert (payload["visible"], payload["rule"], payload["version"]) == (visible, rule, version)


def test_explain_reports_every_version_and_who_granted_what(
    admin_client: tuple[TestClient, Path], make_token: TokenFactory
) -> None:
    client, _ = admin_client
    payload = explain(client, make_token(**ROOT), claims_of("alice"), "refund-policy").json()
    rules = {v["version"]: (v["visible"], v["rule"]) for v in payload["versions"]}
    assert rules == {"1": (False, "effective_to"), "2": (True, "acl")}
    current = payload["versions"][1]
    assert current["matched_principals"] == ["group:staff"]
    assert current["granted_by"] == {"group:staff": "groups"}
    assert "support:eu" in payload["caller"]["principals"]  # the policy's grant for staff
    future = explain(client, make_token(**ROOT), claims_of("alice"), "loyalty").json()
    assert [v["rule"] for v in future["versions"]] == ["acl", "effective_from"]
    nested = explain(
        client, make_token(**ROOT), claims_of("bob", groups=["risk-eu"]), "merchant-fraud"
    )
    assert nested.json()["versions"][0]["granted_by"] == {"group:merchant-risk": "nested:risk-eu"}
    # IDs and rule names only: nothing of the document's title or text.
    assert "Merchant fraud" not in nested.text and "suspended" not in nested.text


def test_explain_agrees_with_what_search_returns(
    admin_client: tuple[TestClient, Path], make_token: TokenFactory
) -> None:
    client, _ = admin_client
    for caller in (ALICE, BOB, {"sub": "zed", "groups": []}):
        results = client.post(
            "/search", json={"query": "rule", "top_k": 100}, headers=bearer(make_token(**caller))
        ).json()["results"]
        seen = {r["doc_id"] for r in results}
        for doc_id in ("refund-policy", "merchant-fraud", "loyalty", "dup-b", "ended-yesterday"):
            subject = {"tenant": "acme", "region": "EU", "groups": [], **caller}
            verdict = explain(client, make_token(**ROOT), subject, doc_id).json()["visible"]
            if doc_id in seen:
                assert verdict, (caller, doc_id)
            if not verdict:
                assert doc_id not in seen, (caller, doc_id)


def test_admins_explain_only_their_own_tenant(
    admin_client: tuple[TestClient, Path], make_token: TokenFactory
) -> None:
    client, _ = admin_client
    missing = explain(client, make_token(**EVE), claims_of("alice"), "no-such-doc")
    other_tenant = explain(client, make_token(**EVE), claims_of("alice"), "refund-policy")
    assert missing.status_code == other_tenant.status_code == 404
    assert missing.content == other_tenant.content
    own = explain(client, make_token(**EVE), claims_of("dave", tenant="globex"), "globex-pricing")
    assert own.status_code == 200 and own.json()["visible"] is True
    assert day(0) == own.json()["as_of"]


def test_a_tenants_own_admins_are_admins_there_and_nowhere_else(
    tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    # ann administers globex; a subject called ann in acme (another identity) is nobody.
    policy_dir = write_policy(
        tmp_path / "policy",
        admins={"groups": [], "tenants": {"globex": {"subjects": ["ann"]}}},
    )
    settings = make_settings(data_dir, jwks_file, policy_dir)
    with TestClient(create_app(settings, embedder=embedder)) as client:
        globex_ann = make_token(sub="ann", tenant="globex", groups=[])
        acme_ann = make_token(sub="ann", tenant="acme", groups=[])
        subject = claims_of("dave", tenant="globex")
        assert explain(client, globex_ann, subject, "globex-pricing").status_code == 200
        refused = explain(client, acme_ann, claims_of("alice"), "refund-policy")
        assert refused.status_code == 403


def test_only_operators_read_and_reload_the_shared_policy(
    admin_client: tuple[TestClient, Path], make_token: TokenFactory
) -> None:
    """The policy is every tenant's: a tenant's admin (eve of globex, in the same admin group
    as root) may explain within globex, but not read or reload what acme shares."""
    client, _ = admin_client
    for claims, status in ((EVE, 403), (ROOT, 200), ({**ROOT, "tenant": "globex"}, 403)):
        headers = bearer(make_token(**claims))
        assert client.get("/admin/policy", headers=headers).status_code == status, claims
        assert client.post("/admin/policy/reload", headers=headers).status_code == status, claims
    eve = explain(client, make_token(**EVE), claims_of("dave", tenant="globex"), "globex-pricing")
    assert eve.status_code == 200
