"""The directory at /scim/v2, in process: discovery, Users and Groups as RFC 7644 has them,
scim keys that reach only it, and directory groups as principals (a membership, a
deactivation or a delete enforced by the next request, a token's groups overage filled
from the directory, Try as and the policy preview counting directory groups)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from gateway.authn.apikeys import create_key
from gateway.authn.devkeys import SigningKey
from gateway.storage.layout import DataLayout
from tests.helpers.identity import AUDIENCE, ISSUER, TokenFactory, bearer
from tests.helpers.policies import write_policy
from tests.helpers.scim import ERROR, GROUP, PATCH, SCIM_JSON, USER, Scim, scim_key


def found(client: TestClient, token: str, query: str) -> Any:
    response = client.post("/search", json={"query": query, "top_k": 50}, headers=bearer(token))
    return response


def doc_ids(response: Any) -> set[str]:
    assert response.status_code == 200, response.text
    return {r["doc_id"] for r in response.json()["results"]}


def test_discovery_is_scim_json_and_refuses_other_methods(acme: Scim) -> None:
    config = acme("GET", "/ServiceProviderConfig").json()
    assert config["patch"]["supported"] and not config["bulk"]["supported"]
    types = acme("GET", "/ResourceTypes").json()
    assert {t["id"] for t in types["Resources"]} == {"User", "Group"}
    schemas = acme("GET", "/Schemas").json()
    assert {s["id"] for s in schemas["Resources"]} >= {USER, GROUP}
    assert acme("GET", f"/Schemas/{USER}").json()["name"] == "User"
    for path in ("/ServiceProviderConfig", "/ResourceTypes", "/Schemas"):
        refused = acme("POST", path, {"schemas": [USER]})
        assert refused.status_code == 405 and refused.json()["schemas"] == [ERROR]
        assert acme("DELETE", path).status_code == 405
    missing = acme("GET", "/NoSuchThing")
    assert missing.status_code == 404 and missing.json()["status"] == "404"


def test_scim_keys_reach_only_the_directory_and_nothing_else_reaches_it(
    app: tuple[TestClient, DataLayout], acme: Scim, make_token: TokenFactory
) -> None:
    client, layout = app
    catalog = layout.open_catalog()
    search, _ = create_key(
        catalog, tenant="acme", region="EU", principals=["group:staff"], scope="search"
    )
    ingest, _ = create_key(catalog, tenant="acme", region="EU", principals=[], scope="ingest")
    for token in (search, ingest, make_token(groups=["ops"])):  # ops: an admin, still no
        refused = client.get("/scim/v2/Users", headers=bearer(token))
        assert refused.status_code == 403 and refused.json()["schemas"] == [ERROR]
    refused = client.post(
        "/scim/v2/Users", json={"schemas": [USER], "userName": "x"}, headers=bearer(search)
    )
    assert refused.status_code == 403 and refused.json()["schemas"] == [ERROR]
    assert client.get("/scim/v2/Users").status_code == 401
    key = acme.headers
    for method, path in (
        ("POST", "/search"),
        ("POST", "/answer"),
        ("GET", "/admin/index"),
        ("GET", "/admin/jobs/x"),
        ("GET", "/v1/models"),
    ):
        answer = client.request(method, path, json={"query": "refunds"}, headers=key)
        assert answer.status_code == 403, (path, answer.text)
    assert acme("GET", "/Users").status_code == 200


def test_users_are_created_found_replaced_patched_and_deleted(acme: Scim) -> None:
    ann = acme.user("Ann.Lee", externalId="e-ann", name={"givenName": "Ann"})
    again = acme("POST", "/Users", {"schemas": [USER], "userName": "ann.lee"})
    assert again.status_code == 409 and again.json()["scimType"] == "uniqueness"
    listed = acme("GET", '/Users?filter=userName eq "ANN.LEE"').json()
    assert [u["id"] for u in listed["Resources"]] == [ann] and listed["totalResults"] == 1
    assert acme("GET", '/Users?filter=externalId eq "e-ann"').json()["totalResults"] == 1
    assert acme("GET", '/Users?filter=externalId eq "nobody"').json()["Resources"] == []
    for n in range(3):
        acme.user(f"paged-{n}")
    first = acme("GET", "/Users?startIndex=1&count=2").json()
    second = acme("GET", "/Users?startIndex=3&count=2").json()
    assert first["itemsPerPage"] == 2 and first["totalResults"] == second["totalResults"]
    assert not {u["id"] for u in first["Resources"]} & {u["id"] for u in second["Resources"]}
    replaced = acme(
        "PUT", f"/Users/{ann}", {"schemas": [USER], "userName": "Ann.Lee", "title": "CFO"}
    ).json()
    assert replaced["title"] == "CFO" and "name" not in replaced
    patched = acme.patch(
        f"/Users/{ann}",
        {"op": "Replace", "path": "active", "value": "False"},  # as Entra ID sends it
        {"op": "add", "path": 'emails[type eq "work"].value', "value": "ann@acme.test"},
        {"op": "replace", "value": {"displayName": "Ann Lee", "name.givenName": "Ann"}},
    ).json()
    assert patched["active"] is False and patched["displayName"] == "Ann Lee"
    assert patched["emails"] == [{"type": "work", "value": "ann@acme.test"}]
    assert patched["name"] == {"givenName": "Ann"}
    enterprise = "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"
    managed = acme.patch(  # Entra ID sends the manager's ID alone, and Okta a password
        f"/Users/{ann}",
        {"op": "Add", "path": f"{enterprise}:manager", "value": "boss-id"},
        {"op": "replace", "path": "password", "value": "s3cret"},
    )
    assert managed.status_code == 200, managed.text
    assert managed.json()[enterprise] == {"manager": {"value": "boss-id"}}
    assert "password" not in managed.json() and "s3cret" not in managed.text
    removed = acme.patch(f"/Users/{ann}", {"op": "remove", "path": "emails"}).json()
    assert "emails" not in removed
    assert acme("DELETE", f"/Users/{ann}").status_code == 204
    assert acme("GET", f"/Users/{ann}").status_code == 404
    assert acme("DELETE", f"/Users/{ann}").status_code == 404
    # Provisioned again after the delete: a new user takes the name.
    assert acme.user("ann.lee") != ann


def test_directory_groups_are_principals_enforced_on_the_next_request(
    acme: Scim, app: tuple[TestClient, DataLayout], make_token: TokenFactory
) -> None:
    client = app[0]
    gus = acme.user("gus")
    token = make_token(sub="gus", groups=["staff"])
    assert "merchant-fraud" not in doc_ids(found(client, token, "merchants above MRX-7781"))
    risk = acme.group("merchant-risk", gus)
    seen = doc_ids(found(client, token, "merchants above MRX-7781"))
    assert "merchant-fraud" in seen  # the next request holds the directory group
    explained = client.post(
        "/admin/explain",
        json={
            "subject": {"sub": "gus", "tenant": "acme", "region": "EU"},
            "doc_id": "merchant-fraud",
        },
        headers=bearer(make_token(sub="root", groups=["ops"])),
    ).json()
    assert explained["visible"] and "group:merchant-risk" in explained["caller"]["principals"]
    renamed = acme.patch(f"/Groups/{risk}", {"op": "replace", "path": "displayName", "value": "r2"})
    assert renamed.status_code == 200
    assert "merchant-fraud" not in doc_ids(found(client, token, "merchants above MRX-7781"))
    acme.patch(
        f"/Groups/{risk}", {"op": "replace", "path": "displayName", "value": "merchant-risk"}
    )
    assert "merchant-fraud" in doc_ids(found(client, token, "merchants above MRX-7781"))
    acme.patch(f"/Groups/{risk}", {"op": "remove", "path": f'members[value eq "{gus}"]'})
    assert "merchant-fraud" not in doc_ids(found(client, token, "merchants above MRX-7781"))
    acme.patch(f"/Groups/{risk}", {"op": "add", "path": "members", "value": [{"value": gus}]})
    assert "merchant-fraud" in doc_ids(found(client, token, "merchants above MRX-7781"))
    assert acme("DELETE", f"/Groups/{risk}").status_code == 204
    assert "merchant-fraud" not in doc_ids(found(client, token, "merchants above MRX-7781"))


def test_a_deactivated_or_deleted_user_is_refused_whatever_its_token_says(
    acme: Scim, app: tuple[TestClient, DataLayout], make_token: TokenFactory
) -> None:
    client = app[0]
    hal = acme.user("hal")
    token = make_token(sub="hal", groups=["staff", "ops"])
    assert found(client, token, "refunds").status_code == 200
    acme.patch(f"/Users/{hal}", {"op": "replace", "path": "active", "value": False})
    for refused in (
        found(client, token, "refunds"),
        client.get("/admin/index", headers=bearer(token)),
    ):
        assert refused.status_code == 403 and refused.json()["code"] == "account_disabled"
    explained = client.post(
        "/admin/explain",
        json={
            "subject": {"sub": "hal", "tenant": "acme", "region": "EU"},
            "doc_id": "refund-policy",
        },
        headers=bearer(make_token(sub="root", groups=["ops"])),
    ).json()
    assert explained["rule"] == "account_disabled" and not explained["visible"]
    acme.patch(f"/Users/{hal}", {"op": "replace", "value": {"active": True}})
    assert found(client, token, "refunds").status_code == 200
    acme("DELETE", f"/Users/{hal}")
    refused = found(client, token, "refunds")
    assert refused.status_code == 403 and refused.json()["code"] == "account_disabled"
    # The same name in another tenant is another person: globex's hal is not refused.
    assert found(client, make_token(sub="hal", tenant="globex"), "refunds").status_code == 200


def without_groups(key: SigningKey, sub: str, **extra: Any) -> str:
    """A token as Entra ID sends one past its groups limit: no `groups` claim at all."""
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now, "exp": now + 300}
    return key.sign({**claims, "tenant": "acme", "region": "EU", **extra})


def test_a_groups_overage_takes_its_groups_from_the_directory(
    acme: Scim, app: tuple[TestClient, DataLayout], signing_key: SigningKey
) -> None:
    client = app[0]
    ivy = acme.user("ivy")
    acme.group("merchant-risk-ivy", ivy)
    acme.group("staff", ivy)
    overage = {"_claim_names": {"groups": "src1"}, "_claim_sources": {"src1": {"endpoint": "x"}}}
    for extra in (overage, {"hasgroups": True}):
        token = without_groups(signing_key, sub="ivy", **extra)
        assert "refund-policy" in doc_ids(found(client, token, "refunds paid RPL-14"))
        stranger = without_groups(signing_key, sub="nobody-in-directory", **extra)
        assert found(client, stranger, "refunds").status_code == 200  # never an error


def test_another_tenants_ids_are_not_found_and_change_nothing(
    acme: Scim, app: tuple[TestClient, DataLayout]
) -> None:
    globex = Scim(app[0], scim_key(app[1], "globex"))
    jay = acme.user("jay")
    team = acme.group("team-jay", jay)
    before = acme.everything()
    for method, path, body in (
        ("GET", f"/Users/{jay}", None),
        ("PUT", f"/Users/{jay}", {"schemas": [USER], "userName": "jay"}),
        (
            "PATCH",
            f"/Users/{jay}",
            {"schemas": [PATCH], "Operations": [{"op": "remove", "path": "title"}]},
        ),
        ("DELETE", f"/Users/{jay}", None),
        ("GET", f"/Groups/{team}", None),
        (
            "PATCH",
            f"/Groups/{team}",
            {"schemas": [PATCH], "Operations": [{"op": "remove", "path": "members"}]},
        ),
        ("DELETE", f"/Groups/{team}", None),
    ):
        refused = globex(method, path, body)
        assert refused.status_code == 404 and refused.json()["schemas"] == [ERROR], path
    assert globex("GET", '/Users?filter=userName eq "jay"').json()["totalResults"] == 0
    stolen = globex(
        "POST", "/Groups", {"schemas": [GROUP], "displayName": "x", "members": [{"value": jay}]}
    )
    assert stolen.status_code == 400 and stolen.json()["scimType"] == "invalidValue"
    assert acme.everything() == before


def test_bad_input_is_a_scim_error_and_changes_nothing(acme: Scim) -> None:
    kim = acme.user("kim")
    crew = acme.group("crew", kim)
    ops = lambda *o: {"schemas": [PATCH], "Operations": list(o)}  # noqa: E731
    many = [{"value": f"u{n:05d}"} for n in range(10_000)]
    table: list[tuple[str, str, Any, int, str | None]] = [
        (
            "POST",
            "/Users",
            {"schemas": [USER], "userName": "x", "shoeSize": 9},
            400,
            "invalidSyntax",
        ),
        (
            "POST",
            "/Users",
            {"schemas": [USER], "userName": "x", "name": {"nick": "y"}},
            400,
            "invalidSyntax",
        ),
        ("POST", "/Users", {"schemas": [USER]}, 400, "invalidValue"),
        ("POST", "/Users", {"userName": "x"}, 400, "invalidSyntax"),
        ("POST", "/Users", {"schemas": [USER], "userName": 7}, 400, "invalidValue"),
        (
            "POST",
            "/Users",
            {"schemas": [USER], "userName": "x", "active": "maybe"},
            400,
            "invalidValue",
        ),
        ("POST", "/Users", [1, 2], 400, "invalidSyntax"),
        ("POST", "/Users", {"schemas": [USER], "userName": "\u20ac" * 667}, 400, "invalidValue"),
        (
            "POST",
            "/Groups",
            {"schemas": [GROUP], "displayName": "x", "owner": "y"},
            400,
            "invalidSyntax",
        ),
        ("POST", "/Groups", {"schemas": [GROUP], "displayName": ""}, 400, "invalidValue"),
        (
            "POST",
            "/Groups",
            {"schemas": [GROUP], "displayName": "x", "members": many},
            400,
            "invalidValue",
        ),
        (
            "POST",
            "/Groups",
            {"schemas": [GROUP], "displayName": "x", "members": [{"value": "nope"}]},
            400,
            "invalidValue",
        ),
        ("GET", '/Users?filter=userName co "k"', None, 400, "invalidFilter"),
        ("GET", '/Users?filter=userName eq "k" and title eq "x"', None, 400, "invalidFilter"),
        ("GET", "/Users?filter=userName eq", None, 400, "invalidFilter"),
        ("GET", '/Users?filter=title eq "x"', None, 400, "invalidFilter"),
        ("GET", '/Users?filter=userName eq "unterminated', None, 400, "invalidFilter"),
        ("GET", "/Users?startIndex=one", None, 400, "invalidValue"),
        ("GET", '/Groups?filter=members eq "x"', None, 400, "invalidFilter"),
        (
            "PATCH",
            f"/Users/{kim}",
            ops({"op": "add", "path": "shoeSize", "value": 9}),
            400,
            "invalidPath",
        ),
        (
            "PATCH",
            f"/Users/{kim}",
            ops({"op": "replace", "path": "name.nick", "value": "x"}),
            400,
            "invalidPath",
        ),
        (
            "PATCH",
            f"/Users/{kim}",
            ops({"op": "remove", "path": 'emails[type eq "work"]'}),
            400,
            "noTarget",
        ),
        ("PATCH", f"/Users/{kim}", ops({"op": "remove"}), 400, "noTarget"),
        (
            "PATCH",
            f"/Users/{kim}",
            ops({"op": "replace", "path": "groups", "value": []}),
            400,
            "mutability",
        ),
        (
            "PATCH",
            f"/Users/{kim}",
            ops({"op": "move", "path": "title", "value": "x"}),
            400,
            "invalidSyntax",
        ),
        (
            "PATCH",
            f"/Users/{kim}",
            ops(
                {"op": "replace", "path": "title", "value": "ok"},
                {"op": "add", "path": "x[", "value": 1},
            ),
            400,
            "invalidPath",
        ),
        ("PATCH", f"/Users/{kim}", {"Operations": []}, 400, "invalidSyntax"),
        (
            "PATCH",
            f"/Groups/{crew}",
            ops({"op": "add", "path": "members", "value": many}),
            400,
            "invalidValue",
        ),
        (
            "PATCH",
            f"/Groups/{crew}",
            ops(*[{"op": "add", "path": "members", "value": many[i : i + 900]} for i in (0, 900)]),
            400,
            "invalidValue",
        ),
        (
            "PATCH",
            f"/Groups/{crew}",
            ops({"op": "add", "path": "members", "value": [{"value": kim}, {"value": "nope"}]}),
            400,
            "invalidValue",
        ),
        (
            "PATCH",
            f"/Groups/{crew}",
            ops({"op": "add", "path": "members", "value": [{"value": crew, "type": "Group"}]}),
            400,
            "invalidValue",
        ),
        (
            "PATCH",
            f"/Groups/{crew}",
            ops({"op": "remove", "path": 'members[value eq "nope"]'}),
            400,
            "noTarget",
        ),
        (
            "PATCH",
            f"/Groups/{crew}",
            ops({"op": "replace", "path": "owner", "value": "x"}),
            400,
            "invalidPath",
        ),
        (
            "PATCH",
            f"/Groups/{crew}",
            ops({"op": "remove", "path": "displayName"}),
            400,
            "mutability",
        ),
        (
            "PATCH",
            f"/Groups/{crew}",
            ops({"op": "replace", "path": "displayName", "value": "x" * 100_000}),
            400,
            "invalidValue",
        ),
        (
            "PATCH",
            f"/Groups/{crew}",
            ops({"op": "replace", "path": "members[value eq 1", "value": []}),
            400,
            "invalidPath",
        ),
        ("PATCH", "/Users/no-such-id", ops({"op": "remove", "path": "title"}), 404, None),
        (
            "PUT",
            f"/Groups/{crew}",
            {"schemas": [GROUP], "displayName": "crew", "members": [{"value": "nope"}]},
            400,
            "invalidValue",
        ),
    ]
    before = acme.everything()
    for method, path, body, status, scim_type in table:
        refused = acme(method, path, body)
        assert refused.status_code == status, (method, path, refused.text)
        error = refused.json()
        assert error["schemas"] == [ERROR] and error["status"] == str(status), error
        assert error.get("scimType") == scim_type, (path, error)
    nested = acme.client.post(
        "/scim/v2/Users",
        content=b"[" * 100_000 + b"]" * 100_000,
        headers={**acme.headers, "content-type": SCIM_JSON},
    )
    assert nested.status_code == 400 and nested.json()["scimType"] == "invalidSyntax"
    far = acme("GET", f"/Users?startIndex={10**30}&count=5")
    assert far.status_code == 200 and far.json()["Resources"] == []
    not_json = acme.client.post(
        "/scim/v2/Users", content=b"{not json", headers={**acme.headers, "content-type": SCIM_JSON}
    )
    assert not_json.status_code == 400 and not_json.json()["scimType"] == "invalidSyntax"
    assert acme.everything() == before


def test_the_policy_preview_counts_directory_groups(
    acme: Scim, app: tuple[TestClient, DataLayout], make_token: TokenFactory, tmp_path: Path
) -> None:
    client, layout = app
    admin = bearer(make_token(sub="root", groups=["ops"]))
    lee = acme.user("lee")
    acme.group("contractors", lee)
    policy_dir = write_policy(tmp_path)  # the serving policy's text, as the fixture wrote it
    files = {p.name: p.read_text() for p in sorted(policy_dir.glob("*.yaml"))}
    text = files["policy.yaml"].replace(
        "grants:", "grants:\n- group: contractors\n  grants: [group:merchant-risk]", 1
    )
    preview = client.post(
        "/admin/policy/preview", json={"files": {**files, "policy.yaml": text}}, headers=admin
    )
    assert preview.status_code == 200, preview.text
    body = preview.json()
    held = layout.open_catalog().directory.group_names("acme")
    assert body["covers"]["directory_groups"] == len(held) > 0
    assert any("directory" in note for note in body["covers"]["notes"])
    assert any("contractors" in c["groups"] for c in body["changes"]), body["changes"]
