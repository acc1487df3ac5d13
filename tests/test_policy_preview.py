"""POST /admin/policy/preview: what an edited policy would change for the callers of the
admin's own tenant, decided against the catalog, with nothing applied; a policy that
does not load is 422 with every problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from fastapi.testclient import TestClient

from gateway.storage.layout import DataLayout
from tests import test_admin_api
from tests.helpers.callers import ALICE, EVE, ROOT
from tests.helpers.identity import TokenFactory, bearer

admin_client = test_admin_api.admin_client  # the serving app and its policy dir


def edited(policy_dir: Path, **changes: Any) -> dict[str, str]:
    """The serving policy's files with `changes`, as an admin's editor would send them."""
    policy = yaml.safe_load((policy_dir / "policy.yaml").read_text())
    policy.update(changes)
    return {"policy.yaml": yaml.safe_dump(policy)}


def test_a_widening_edit_shows_who_gains_what_and_changes_nothing(
    admin_client: tuple[TestClient, Path], make_token: TokenFactory
) -> None:
    client, policy_dir = admin_client
    root = bearer(make_token(**ROOT))
    serving = client.get("/admin/policy", headers=root).json()["version"]
    nested = {"ops": ["gateway-admins"], "risk-eu": ["merchant-risk"], "staff": ["merchant-risk"]}
    response = client.post(
        "/admin/policy/preview",
        json={"files": edited(policy_dir, nested_groups=nested)},
        headers=root,
    )
    assert response.status_code == 200, response.text
    preview = response.json()
    assert preview["base_version"] == serving and preview["new_version"] != serving
    assert preview["widens"] is True and preview["gained"] >= 1 and preview["lost"] == 0
    staff = next(c for c in preview["changes"] if "staff" in c["groups"])
    assert "EU" in staff["regions"] and "merchant-fraud@1" in staff["gains"]
    assert preview["covers"]["documents"] > 0 and preview["covers"]["notes"]

    # Nothing applied: the same policy serves, and staff still cannot see the document.
    assert client.get("/admin/policy", headers=root).json()["version"] == serving
    alice = bearer(make_token(**ALICE))
    found = client.post("/search", json={"query": "chargeback threshold"}, headers=alice)
    assert "merchant-fraud" not in {r["doc_id"] for r in found.json()["results"]}

    same = client.post(
        "/admin/policy/preview", json={"files": edited(policy_dir)}, headers=root
    ).json()
    assert same["widens"] is False and same["changes"] == []


def test_an_admin_previews_only_their_own_tenant(
    admin_client: tuple[TestClient, Path], make_token: TokenFactory
) -> None:
    client, policy_dir = admin_client
    nested = {"ops": ["gateway-admins"], "staff": ["merchant-risk"]}
    body = {"files": edited(policy_dir, nested_groups=nested)}
    globex = client.post("/admin/policy/preview", json=body, headers=bearer(make_token(**EVE)))
    assert globex.status_code == 200
    gains = {d for c in globex.json()["changes"] for d in c["gains"]}
    assert "merchant-fraud@1" not in gains  # acme's document, not in globex's diff
    for claims in (ALICE, {**ALICE, "admin": True}):
        refused = client.post(
            "/admin/policy/preview", json=body, headers=bearer(make_token(**claims))
        )
        assert refused.status_code == 403
    assert client.post("/admin/policy/preview", json=body).status_code == 401


def test_a_policy_that_does_not_load_is_422_with_every_problem(
    admin_client: tuple[TestClient, Path], make_token: TokenFactory
) -> None:
    client, policy_dir = admin_client
    root = bearer(make_token(**ROOT))
    serving = client.get("/admin/policy", headers=root).json()["version"]

    def preview(files: dict[str, str]) -> dict[str, Any]:
        response = client.post("/admin/policy/preview", json={"files": files}, headers=root)
        assert response.status_code == 422, response.text
        assert response.headers["content-type"].startswith("application/problem+json")
        problem: dict[str, Any] = response.json()
        assert problem["code"] == "invalid_policy"
        return problem

    unknown = preview({"policy.yaml": "bypass: true\nregions: {global_readable: maybe}\n"})
    assert len(unknown["problems"]) == 2
    assert any("bypass" in p for p in unknown["problems"])
    assert any("regions.global_readable" in p for p in unknown["problems"])
    assert all(p.startswith("policy.yaml: ") for p in unknown["problems"])  # no server paths

    bad_yaml = preview({"a.yaml": "nested_groups: [unclosed\n", "b.yaml": "grants: 3\n"})
    assert any(p.startswith("a.yaml: not valid YAML") for p in bad_yaml["problems"])
    assert any("grants" in p for p in bad_yaml["problems"])

    cycle = preview(edited(policy_dir, nested_groups={"a": ["b"], "b": ["c"], "c": ["a"]}))
    assert any("cycle: a -> b -> c -> a" in p for p in cycle["problems"])

    names = preview({"../escape.yaml": "{}", "notes.txt": "{}"})
    assert len(names["problems"]) == 2

    assert client.get("/admin/policy", headers=root).json()["version"] == serving


def test_the_index_route_counts_the_admins_own_tenant(
    admin_client: tuple[TestClient, Path], make_token: TokenFactory, data_dir: Path
) -> None:
    client, _ = admin_client
    rows = DataLayout(data_dir).open_catalog().visibilities()
    for claims, tenant in ((ROOT, "acme"), (EVE, "globex")):
        index = client.get("/admin/index", headers=bearer(make_token(**claims)))
        assert index.status_code == 200, index.text
        body = index.json()
        mine = [(doc_id, version) for doc_id, version, v in rows if v.tenant == tenant]
        assert body["versions"] == len(mine) and body["documents"] == len({d for d, _ in mine})
        assert body["chunks"] >= body["versions"] and body["index_generation"] >= 1
        assert body["jobs"] == []  # ingested by the CLI, not the push API
    assert client.get("/admin/index", headers=bearer(make_token(**ALICE))).status_code == 403
    assert (
        client.get("/admin/index?jobs=101", headers=bearer(make_token(**ROOT))).status_code == 422
    )
