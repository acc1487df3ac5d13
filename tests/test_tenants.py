"""Tenants share nothing: a document version is (tenant, doc_id, version).

Two tenants each have a `handbook`. Before, the second ingest replaced the first tenant's
version in the catalog and both engines, a newer version of one tenant closed the other
tenant's, and `gateway delete` / `acl set` acted on every tenant's `handbook`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from gateway.api.app import create_app
from gateway.cli import app as cli
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.ingest.pipeline import ingest_paths
from gateway.storage.catalog import Catalog
from gateway.storage.layout import DataLayout
from tests.helpers.documents import day, write_doc
from tests.helpers.identity import TokenFactory, bearer, make_settings

HANDBOOK = {"doc_id": "handbook", "region": "EU", "acl": ["group:staff"]}


def handbook(tenant: str, version: str, start: str) -> dict[str, Any]:
    return {**HANDBOOK, "tenant": tenant, "version": version, "effective_from": start}


@pytest.fixture
def two_tenants(tmp_path: Path, embedder: Embedder) -> DataLayout:
    docs = tmp_path / "docs"
    write_doc(docs, "acme.md", handbook("acme", "1", "2020-01-01"), "Acme rule ACM-1111.")
    write_doc(docs, "globex.md", handbook("globex", "1", "2020-01-01"), "Globex rule GLX-2222.")
    layout = DataLayout(tmp_path / "data")
    ingest_paths([docs], layout, embedder)
    # globex publishes version 2, starting ten days ago: it closes globex's version 1 only.
    later = tmp_path / "later"
    write_doc(later, "g2.md", handbook("globex", "2", day(-10)), "Globex rule GLX-3333.")
    ingest_paths([later], layout, embedder)
    return layout


@pytest.fixture
def client(two_tenants: DataLayout, jwks_file: Path, embedder: Embedder) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(two_tenants.root, jwks_file), embedder=embedder)) as c:
        yield c


def test_each_tenant_keeps_its_own_versions(two_tenants: DataLayout) -> None:
    rows = {(r.tenant, r.version): r for r in two_tenants.open_catalog().all_documents()}
    assert set(rows) == {("acme", "1"), ("globex", "1"), ("globex", "2")}
    assert rows[("acme", "1")].effective_to is None  # not closed by globex's version 2
    assert rows[("acme", "1")].closed_by is None
    assert rows[("globex", "1")].closed_by == "handbook@2"


def test_documents_chunks_and_search_resolve_within_the_callers_tenant(
    client: TestClient, make_token: TokenFactory
) -> None:
    acme = bearer(make_token(sub="alice", tenant="acme"))
    globex = bearer(make_token(sub="dave", tenant="globex"))
    document = client.get("/documents/handbook", headers=acme).json()
    assert (document["tenant"], document["version"], document["effective_to"]) == (
        "acme",
        "1",
        None,
    )
    assert "ACM-1111" in document["text"]
    assert "ACM-1111" in client.get("/chunks/handbook@1:0", headers=acme).json()["text"]
    # globex's own version 1 was closed by its version 2: not acme's, which stays open.
    assert client.get("/chunks/handbook@1:0", headers=globex).status_code == 404
    assert "GLX-3333" in client.get("/chunks/handbook@2:0", headers=globex).json()["text"]
    assert client.get("/chunks/handbook@2:0", headers=acme).status_code == 404
    found = client.post("/search", json={"query": "rule handbook"}, headers=acme).json()
    assert [r["text"] for r in found["results"]] == ["Acme rule ACM-1111."]
    found = client.post("/search", json={"query": "rule handbook"}, headers=globex).json()
    assert [r["text"] for r in found["results"]] == ["Globex rule GLX-3333."]


def test_commands_act_on_one_tenant_only(
    two_tenants: DataLayout, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    runner, data = CliRunner(), ["--data-dir", str(two_tenants.root)]
    ambiguous = runner.invoke(cli, ["delete", "handbook", *data])
    assert ambiguous.exit_code == 1 and "--tenant" in ambiguous.output
    acl = ["acl", "set", "handbook", "--acl", "group:board", "--tenant", "acme", *data]
    assert runner.invoke(cli, acl).exit_code == 0
    deleted = runner.invoke(cli, ["delete", "handbook", "--tenant", "globex", *data])
    assert deleted.exit_code == 0, deleted.output
    rows = {(r.tenant, r.version): r for r in two_tenants.open_catalog().all_documents()}
    assert set(rows) == {("acme", "1")}
    assert rows[("acme", "1")].visibility.acl == ("group:board",)
    settings = make_settings(two_tenants.root, jwks_file)
    with TestClient(create_app(settings, embedder=embedder)) as c:
        board = bearer(make_token(sub="ann", tenant="acme", groups=["board"]))
        found = c.post("/search", json={"query": "rule handbook"}, headers=board).json()
        assert [r["text"] for r in found["results"]] == ["Acme rule ACM-1111."]
        # With one tenant left, the ID alone is unambiguous again.
        only = runner.invoke(cli, ["acl", "set", "handbook", "--acl", "group:staff", *data])
        assert only.exit_code == 0, only.output


def test_a_catalog_from_before_tenant_identity_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    with sqlite3.connect(path) as db:  # the chunks table as the previous release made it
        db.execute("CREATE TABLE chunks (chunk_id TEXT PRIMARY KEY, doc_id TEXT, text TEXT)")
    with pytest.raises(GatewayError) as refused:
        Catalog(path)
    assert refused.value.code == "catalog_outdated"
    assert "fresh data dir" in refused.value.detail
