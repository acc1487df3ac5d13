"""One rule for principal and user names at every door (token claims, ACLs at ingest and
push, API key principals, SCIM, the policy): a name is compared in Unicode NFC, so "José"
sent decomposed is José; format characters (the ZWNJ Persian writes) and no-break spaces
inside a name are text; an empty name, a control character, or whitespace at either end is
refused where the name enters (gateway/domain.py, `name_problem` and `canonical_name`).
Migration 0016 writes the directory's stored names again in NFC."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Connection, Engine, create_engine, text

from gateway.authn.apikeys import create_key
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.ingest.pipeline import ingest_paths
from gateway.policy.loader import load_policy
from gateway.storage import schema
from gateway.storage.catalog import open_engine
from gateway.storage.layout import DataLayout
from tests.helpers.documents import doc, write_doc
from tests.helpers.identity import TokenFactory, bearer
from tests.helpers.policies import write_policy
from tests.helpers.postgres import Cluster
from tests.helpers.push_app import PushApp, push_app
from tests.helpers.scim import GROUP, USER, Scim, scim_key


def nfc(name: str) -> str:
    return unicodedata.normalize("NFC", name)


def nfd(name: str) -> str:
    return unicodedata.normalize("NFD", name)


PERSIAN = "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"  # "I want", with its ZWNJ
NBSP = "Sales\u00a0Team"
META = {"tenant": "acme", "region": "EU", "effective_from": "2020-01-01"}
ZOE_CO = {"tenant": "zoe-co", "region": "EU", "effective_from": "2020-01-01"}


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, embedder: Embedder, jwks_file: Path
) -> Iterator[PushApp]:
    """The test corpus, and documents `gateway ingest` took with ACLs in either form."""
    tmp = tmp_path_factory.mktemp("names")
    admins = {"subjects": [], "groups": ["gateway-admins", nfd("Équipe-admins")]}
    with push_app(tmp, embedder, jwks_file, admins=admins) as app:
        docs = tmp / "more"
        jose = [f"user:{nfc('José')}", f"group:{nfc('José')}"]
        write_doc(docs, "a.md", {"doc_id": "jose-doc", **META, "acl": jose}, "Rule JOS-4004.")
        zoe = [f"group:{nfd('Zoë')}"]
        write_doc(docs, "b.md", {"doc_id": "zoe-doc", **META, "acl": zoe}, "Rule ZOE-5005.")
        persian = [f"group:{PERSIAN}"]
        write_doc(docs, "c.md", {"doc_id": "fa-doc", **META, "acl": persian}, "Rule PRS-2002.")
        write_doc(
            docs, "d.md", {"doc_id": "nbsp-doc", **META, "acl": [f"group:{NBSP}"]}, "Rule NBS-3003."
        )
        team = [f"group:{nfc('Zoë-team')}"]
        write_doc(docs, "e.md", {"doc_id": "team-doc", **ZOE_CO, "acl": team}, "Rule TEAM-6006.")
        ingest_paths([docs], app.writer.layout, embedder)
        yield app


def found(client: TestClient, token: str, query: str) -> set[str]:
    response = client.post("/search", json={"query": query, "top_k": 50}, headers=bearer(token))
    assert response.status_code == 200, response.text
    return {r["doc_id"] for r in response.json()["results"]}


def directory_of(app: PushApp, tenant: str) -> Scim:
    return Scim(app.client, scim_key(app.writer.layout, tenant))


# -- 1. one name however its accents are sent (NFC) ------------------------------------


def test_a_token_reads_an_acl_that_names_it_in_the_other_form(
    served: PushApp, make_token: TokenFactory
) -> None:
    client = served.client
    assert "jose-doc" in found(client, make_token(sub="x1", groups=[nfd("José")]), "JOS-4004")
    assert "jose-doc" in found(client, make_token(sub=nfd("José"), groups=[]), "JOS-4004")
    # gateway ingest wrote group:Zoë decomposed; a token sends it composed
    assert "zoe-doc" in found(client, make_token(sub="x2", groups=[nfc("Zoë")]), "ZOE-5005")
    key, _ = create_key(
        served.writer.layout.open_catalog(),
        tenant="acme",
        region="EU",
        principals=[f"group:{nfd('José')}"],
    )
    assert "jose-doc" in found(client, key, "JOS-4004")


def test_a_user_deactivated_in_one_form_is_refused_in_the_other(
    served: PushApp, make_token: TokenFactory
) -> None:
    scim = directory_of(served, "zoe-a")
    zoe = scim.user(nfc("zoë@example.com"))
    scim.patch(f"/Users/{zoe}", {"op": "replace", "path": "active", "value": False})
    for sub in (nfc("zoë@example.com"), nfd("zoë@example.com")):
        token = make_token(sub=sub, tenant="zoe-a", groups=["staff"])
        response = served.client.post("/search", json={"query": "x"}, headers=bearer(token))
        assert response.status_code == 403, response.text
        assert response.json()["code"] == "account_disabled"


def test_a_user_name_sent_in_both_forms_is_one_user(served: PushApp) -> None:
    scim = directory_of(served, "jose-a")
    made = scim("POST", "/Users", {"schemas": [USER], "userName": nfc("José")})
    assert made.status_code == 201, made.text
    again = scim("POST", "/Users", {"schemas": [USER], "userName": nfd("José")})
    assert again.status_code == 409 and again.json()["scimType"] == "uniqueness", again.text
    listed = scim("GET", f'/Users?filter=userName eq "{nfd("José")}"').json()
    assert [u["id"] for u in listed["Resources"]] == [made.json()["id"]]


def test_a_directory_group_sent_decomposed_decides_for_a_token_group_composed(
    served: PushApp, make_token: TokenFactory
) -> None:
    """The directory decides for the groups it has: one it was sent decomposed must still
    withhold the same name that a token sends composed, or a membership SCIM removed would
    stand."""
    scim = directory_of(served, "zoe-co")
    pia = scim.user("pia")
    team = scim.group(nfd("Zoë-team"))  # pia is not in it
    token = make_token(sub="pia", tenant="zoe-co", groups=[nfc("Zoë-team")])
    assert "team-doc" not in found(served.client, token, "TEAM-6006")
    scim.patch(f"/Groups/{team}", {"op": "add", "path": "members", "value": [{"value": pia}]})
    assert "team-doc" in found(served.client, token, "TEAM-6006")
    shown = scim("GET", f"/Groups/{team}").json()["displayName"]
    assert shown == nfc("Zoë-team")


def test_a_policy_name_matches_a_token_that_sends_it_in_the_other_form(
    served: PushApp, make_token: TokenFactory
) -> None:
    # The policy lists Équipe-admins decomposed among its admins.groups (`served`).
    admin = make_token(sub="eve", groups=[nfc("Équipe-admins")])
    assert served.client.get("/admin/index", headers=bearer(admin)).status_code == 200
    other = make_token(sub="eve", groups=["staff"])
    assert served.client.get("/admin/index", headers=bearer(other)).status_code == 403


# -- 2. the push API takes the ACLs gateway ingest takes --------------------------------


def test_a_push_takes_the_acl_gateway_ingest_takes_and_refuses_what_it_refuses(
    served: PushApp, make_token: TokenFactory
) -> None:
    client, key = served.client, served.key
    acl = ["group:Équipe-Paris", f"user:{nfd('José')}", "group:営業部"]
    body = {"documents": [doc("equipe-push", acl=acl, text="Rule EQP-1001 for Paris.")]}
    pushed = client.post("/admin/documents", json=body, headers=bearer(key))
    assert pushed.status_code == 202, pushed.text
    served.writer.run_once()
    assert "equipe-push" in found(client, make_token(sub="p", groups=["Équipe-Paris"]), "EQP-1001")
    assert "equipe-push" in found(client, make_token(sub=nfc("José"), groups=[]), "EQP-1001")
    put = client.put(
        "/admin/documents/equipe-push/acl",
        json={"acl": ["group:営業部", "group:Équipe-Paris"]},
        headers=bearer(key),
    )
    assert put.status_code == 200, put.text
    assert "equipe-push" in found(client, make_token(sub="s", groups=["営業部"]), "EQP-1001")
    # refused as ingest refuses them, naming the entry
    bad = {"documents": [doc("bad-push", acl=["group:staff", "group:staff "])]}
    refused = client.post("/admin/documents", json=bad, headers=bearer(key))
    assert refused.status_code == 422
    assert refused.headers["content-type"].startswith("application/problem+json")
    messages = [e["message"] for e in refused.json()["errors"] if e["field"] == "acl"]
    assert any("'group:staff ' must not start or end with whitespace" in m for m in messages)
    put = client.put(
        "/admin/documents/equipe-push/acl", json={"acl": ["group:a\u0007b"]}, headers=bearer(key)
    )
    assert put.status_code == 422
    assert "contains a control character" in put.text


# -- 3. format characters and no-break spaces are text; 4. no whitespace at either end --


def test_a_name_with_a_zwnj_or_a_no_break_space_is_a_name_at_every_door(
    served: PushApp, make_token: TokenFactory
) -> None:
    client = served.client
    assert "fa-doc" in found(client, make_token(sub="u1", groups=[PERSIAN]), "PRS-2002")
    assert "nbsp-doc" in found(client, make_token(sub="u1", groups=[NBSP]), "NBS-3003")
    found(client, make_token(sub=f"user-{PERSIAN}", groups=[]), "PRS-2002")  # a 200
    key, _ = create_key(
        served.writer.layout.open_catalog(),
        tenant="acme",
        region="EU",
        principals=[f"group:{PERSIAN}"],
    )
    assert "fa-doc" in found(client, key, "PRS-2002")
    scim = directory_of(served, "fa")
    group = scim("POST", "/Groups", {"schemas": [GROUP], "displayName": PERSIAN})
    assert group.status_code == 201, group.text
    family = "\u0646\u06cc\u06a9\u200c\u0646\u0627\u0645"  # a family name with its ZWNJ
    scim.user("reza@example.com", name={"familyName": family})
    body = {"documents": [doc("fa-push", acl=[f"group:{PERSIAN}", f"group:{NBSP}"])]}
    assert client.post("/admin/documents", json=body, headers=bearer(served.key)).status_code == 202


def test_a_name_with_whitespace_at_either_end_is_refused_at_every_door(
    served: PushApp, make_token: TokenFactory, tmp_path: Path
) -> None:
    client = served.client
    token = make_token(sub="alice ", groups=["staff"])
    response = client.post("/search", json={"query": "x"}, headers=bearer(token))
    assert response.status_code == 403 and response.json()["code"] == "insufficient_claims"
    with pytest.raises(ValueError, match="must not start or end with whitespace"):
        create_key(
            served.writer.layout.open_catalog(),
            tenant="acme",
            region="EU",
            principals=["group:staff "],
        )
    scim = directory_of(served, "edges")
    for path, body in (
        ("/Groups", {"schemas": [GROUP], "displayName": "staff "}),
        ("/Groups", {"schemas": [GROUP], "displayName": "\u00a0staff"}),
        ("/Users", {"schemas": [USER], "userName": "jose "}),
        ("/Users", {"schemas": [USER], "userName": "jose", "externalId": " 42"}),
    ):
        refused = scim("POST", path, body)
        assert refused.status_code == 400, refused.text
        assert refused.json()["scimType"] == "invalidValue"
        assert "must not start or end with whitespace" in refused.json()["detail"]
    policy = write_policy(tmp_path / "policy", admins={"groups": ["gateway-admins\u00a0"]})
    with pytest.raises(GatewayError) as invalid:
        load_policy(policy)
    assert invalid.value.code == "invalid_policy"
    assert "'gateway-admins\\xa0' must not start or end with whitespace" in invalid.value.detail


def test_a_policy_nesting_one_group_under_two_forms_of_its_name_is_refused(tmp_path: Path) -> None:
    """Composed and decomposed, "José" is one group: its two entries would have been one
    key, the later silently replacing the earlier."""
    nesting = {nfc("José"): ["staff"], nfd("José"): ["merchant-risk"]}
    with pytest.raises(GatewayError) as invalid:
        load_policy(write_policy(tmp_path / "policy", nested_groups=nesting))
    assert "groups given twice (equal in Unicode NFC)" in invalid.value.detail


# -- migration 0016: the directory's stored names in NFC --------------------------------


def _insert_user(c: Connection, user_id: str, name: str, key: str, **row: object) -> None:
    values = {
        "i": user_id,
        "n": name,
        "k": key,
        "e": row.get("external_id"),
        "d": bool(row.get("deleted", False)),
    }
    c.execute(
        text(
            "INSERT INTO directory_users (tenant, id, user_name, user_name_key, external_id,"
            " active, deleted, attributes_json, created, modified, revision) VALUES ('acme',"
            " :i, :n, :k, :e, NOT :d, :d, '{}', '2020-01-01 00:00:00', '2020-01-01 00:00:00', 1)"
        ),
        values,
    )


def _at_0015(url: str) -> Engine:
    engine = open_engine(url)
    schema.upgrade(engine, "0015")
    return engine


def check_names_migrate(url: str, root: Path) -> None:
    engine = _at_0015(url)
    with engine.begin() as c:
        _insert_user(c, "u1", nfd("Zoë"), nfd("zoë"))
        _insert_user(c, "u2", nfc("José"), nfc("josé"))
        _insert_user(c, "u3", nfd("José"), nfd("josé"), deleted=True)  # a tombstone
        _insert_user(c, "u4", "ext", "ext", external_id=nfd("ext-é"))
        _insert_user(c, "u5", "Zed", "RETIRED-0123", deleted=True)
        c.execute(
            text(
                "INSERT INTO directory_groups (tenant, id, display_name, created, modified,"
                " revision) VALUES ('acme', 'g1', :n, '2020-01-01 00:00:00',"
                " '2020-01-01 00:00:00', 1)"
            ),
            {"n": nfd("Équipe")},
        )
        for name in (nfd("Anciens-é"), nfc("Anciens-é"), nfd("Autres-é")):
            c.execute(text("INSERT INTO directory_retired_groups VALUES ('acme', :n)"), {"n": name})
    schema.upgrade(engine)
    directory = DataLayout(root, url).open_catalog().directory
    zoe = directory.entry("acme", "userName", nfc("ZOë"))  # ASCII letters fold
    assert zoe is not None and zoe.active
    jose = directory.entry("acme", "userName", nfd("josé"))
    assert jose is not None and jose.active and jose.since is not None  # u2, stamped
    assert directory.entry("acme", "externalId", nfc("ext-é")) is not None
    managed = directory.managed_among("acme", [nfc("Équipe"), nfc("Anciens-é"), nfc("Autres-é")])
    assert managed == {nfc("Équipe"), nfc("Anciens-é"), nfc("Autres-é")}
    with engine.connect() as c:
        keys: dict[str, str] = dict(
            c.execute(text("SELECT id, user_name_key FROM directory_users")).all()
        )
        retired = c.execute(text("SELECT display_name FROM directory_retired_groups")).all()
    assert keys["u1"] == nfc("zoë") and keys["u2"] == nfc("josé") and keys["u5"] == "RETIRED-0123"
    assert keys["u3"].startswith("RETIRED-")  # the tombstone gave the name up
    assert sorted(r[0] for r in retired) == [nfc("Anciens-é"), nfc("Autres-é")]


def test_directory_names_migrate_to_nfc_on_sqlite(tmp_path: Path) -> None:
    check_names_migrate(f"sqlite:///{tmp_path / 'catalog.db'}", tmp_path / "data")


@pytest.mark.server
def test_directory_names_migrate_to_nfc_on_postgres(postgres: Cluster, tmp_path: Path) -> None:
    check_names_migrate(postgres.new_database(), tmp_path / "data")


def test_two_live_users_of_one_name_in_nfc_refuse_the_upgrade(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    engine = _at_0015(url)
    with engine.begin() as c:
        _insert_user(c, "u-composed", nfc("Ana-é"), nfc("ana-é"))
        _insert_user(c, "u-decomposed", nfd("Ana-é"), nfd("ana-é"))
    with pytest.raises(GatewayError) as refused:
        schema.upgrade(engine)
    assert "'acme': users u-composed, u-decomposed" in refused.value.detail
    assert "nothing was changed" in refused.value.detail
    with create_engine(url).connect() as c:
        assert schema.revision_of(c) == "0015"
        rows = c.execute(text("SELECT id, user_name_key FROM directory_users")).all()
    assert dict(rows) == {"u-composed": nfc("ana-é"), "u-decomposed": nfd("ana-é")}
