"""ACL changes and deletions over HTTP: the tenant's admins and ingest keys only, within
their tenant, enforced from the very next request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.authn.apikeys import create_key
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ROOT
from tests.helpers.documents import doc, write_corpus
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.policies import write_policy

ALICE = {"sub": "alice", "groups": ["staff"]}  # acme EU staff: reads refund-policy


@pytest.fixture
def served(
    tmp_path: Path, embedder: Embedder, jwks_file: Path
) -> Iterator[tuple[TestClient, DataLayout]]:
    layout = DataLayout(tmp_path / "data")
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    settings = make_settings(layout.root, jwks_file, write_policy(tmp_path / "policy"))
    with TestClient(create_app(settings, embedder=embedder)) as client:
        yield client, layout


def ingest_key(layout: DataLayout, tenant: str) -> str:
    token, _ = create_key(
        layout.open_catalog(), tenant=tenant, region="EU", principals=[], scope="ingest"
    )
    return token


def acl_of(layout: DataLayout, doc_id: str) -> dict[str, tuple[str, ...]]:
    """The stored ACL of each version of one of acme's documents."""
    rows = layout.open_catalog().versions_of([("acme", doc_id)])
    return {r.version: r.visibility.acl for r in rows}


def found(client: TestClient, token: str, query: str = "refunds paid RPL-14") -> set[str]:
    response = client.post("/search", json={"query": query}, headers=bearer(token))
    assert response.status_code == 200, response.text
    return {r["doc_id"] for r in response.json()["results"]}


def test_an_acl_change_is_enforced_on_the_next_request(
    served: tuple[TestClient, DataLayout], make_token: TokenFactory
) -> None:
    client, _ = served
    alice = make_token(**ALICE)
    assert "refund-policy" in found(client, alice)
    changed = client.put(
        "/admin/documents/refund-policy/acl",
        json={"acl": ["group:board"]},
        headers=bearer(make_token(**ROOT)),
    )
    assert changed.status_code == 200, changed.text
    assert changed.json()["versions"] == 2  # both versions of the document
    assert "refund-policy" not in found(client, alice)  # the very next request
    assert client.get("/documents/refund-policy", headers=bearer(alice)).status_code == 404
    again = client.put(
        "/admin/documents/refund-policy/acl",
        json={"acl": ["group:board"]},
        headers=bearer(make_token(**ROOT)),
    )
    assert again.json()["versions"] == 0  # nothing to change, no generation spent


def test_a_delete_is_enforced_on_the_next_request_and_by_an_ingest_key(
    served: tuple[TestClient, DataLayout], make_token: TokenFactory
) -> None:
    client, layout = served
    catalog = layout.open_catalog()
    key, row = create_key(catalog, tenant="acme", region="EU", principals=[], scope="ingest")
    catalog.owners.adopt(
        "acme", f"key:{row.key_id}", None, everything=True
    )  # `gateway ingest` wrote them
    alice = make_token(**ALICE)
    assert "refund-policy" in found(client, alice)
    one = client.delete("/admin/documents/refund-policy?version=2", headers=bearer(key))
    assert one.status_code == 200 and one.json()["versions"] == 1
    document = client.get("/documents/refund-policy", headers=bearer(alice)).json()
    assert document["version"] == "1"  # version 1, closed by 2, is open again
    assert client.delete("/admin/documents/refund-policy", headers=bearer(key)).status_code == 200
    assert "refund-policy" not in found(client, alice)
    missing = client.delete("/admin/documents/refund-policy", headers=bearer(key))
    assert missing.status_code == 404


def test_only_the_tenants_admins_and_ingest_keys_within_their_tenant(
    served: tuple[TestClient, DataLayout], make_token: TokenFactory
) -> None:
    client, layout = served
    catalog = layout.open_catalog()
    search_key, _ = create_key(catalog, tenant="acme", region="EU", principals=["group:staff"])
    globex_ingest, _ = create_key(
        catalog, tenant="globex", region="EU", principals=[], scope="ingest"
    )
    change = {"acl": ["group:board"]}
    path = "/admin/documents/refund-policy/acl"
    assert client.put(path, json=change).status_code == 401
    for token in (search_key, make_token(**ALICE)):  # a search key; a non-admin user
        refused = client.put(path, json=change, headers=bearer(token))
        assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
    # Another tenant's caller: the document is not in its tenant, exactly like a missing one.
    other = client.put(path, json=change, headers=bearer(globex_ingest))
    missing = client.put("/admin/documents/no-such/acl", json=change, headers=bearer(globex_ingest))
    assert other.status_code == missing.status_code == 404
    assert other.json() == missing.json() | {"detail": other.json()["detail"]}
    assert "refund-policy" in found(client, make_token(**ALICE))  # nothing changed


@pytest.mark.parametrize(
    "body",
    [{"acl": []}, {"acl": ["board"]}, {"acl": ["group:board"], "tenant": "globex"}, {}],
)
def test_bad_changes_are_refused_and_change_nothing(
    served: tuple[TestClient, DataLayout], make_token: TokenFactory, body: dict[str, object]
) -> None:
    client, _ = served
    refused = client.put(
        "/admin/documents/refund-policy/acl", json=body, headers=bearer(make_token(**ROOT))
    )
    assert refused.status_code == 422 and refused.json()["code"] == "validation_error"
    assert "refund-policy" in found(client, make_token(**ALICE))


def test_an_acl_entry_a_push_would_refuse_is_refused_by_name_and_changes_nothing(
    served: tuple[TestClient, DataLayout], make_token: TokenFactory
) -> None:
    """`group:staff ` (a trailing space) matches no caller's claim: a push refuses it, and
    an ACL change did not, storing it and hiding the document from group:staff."""
    client, layout = served
    bad = ["group:staff "]
    pushed = client.post(
        "/admin/documents",
        json={"documents": [doc("spaced", acl=bad)]},
        headers=bearer(ingest_key(layout, "acme")),
    )
    assert pushed.status_code == 422, pushed.text
    before = acl_of(layout, "refund-policy")
    refused = client.put(
        "/admin/documents/refund-policy/acl", json={"acl": bad}, headers=bearer(make_token(**ROOT))
    )
    assert refused.status_code == 422, refused.text
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["code"] == "validation_error"
    assert any("'group:staff '" in e["msg"] for e in refused.json()["errors"])  # named
    assert acl_of(layout, "refund-policy") == before
    assert "refund-policy" in found(client, make_token(**ALICE))
