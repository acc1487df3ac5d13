"""Identifiers no write could have made (a NUL, a lone surrogate) name nothing: 404, as a
missing one, on SQLite and on PostgreSQL, which refused a NUL with an error of its own
(a 500) at every route that looked one up."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ALICE, ROOT
from tests.helpers.documents import STAFF_EU, write_doc
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.mcp import call_tool
from tests.helpers.policies import write_policy

UNSTORABLE = ("%00", "a%00b", "%ED%A0%80")  # as a path says them: NUL, a lone surrogate


@pytest.mark.server
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_identifiers_no_write_could_make_are_404(
    database: str,
    tmp_path: Path,
    jwks_file: Path,
    embedder: Embedder,
    make_token: TokenFactory,
    request: pytest.FixtureRequest,
) -> None:
    url = request.getfixturevalue("postgres").new_database() if database == "postgresql" else ""
    settings = make_settings(tmp_path / "data", jwks_file, write_policy(tmp_path / "policy"))
    app = create_app(settings.model_copy(update={"database_url": url}), embedder=embedder)
    admin = bearer(make_token(**ROOT))
    with TestClient(app, raise_server_exceptions=False) as client:
        for bad in UNSTORABLE:
            for method, path, body in (
                ("GET", f"/documents/{bad}", None),
                ("GET", f"/chunks/{bad}", None),
                ("GET", f"/admin/jobs/{bad}", None),
                ("DELETE", f"/admin/documents/{bad}", None),
                ("DELETE", f"/admin/documents/handbook?version={bad}", None),
                ("PUT", f"/admin/documents/{bad}/acl", {"acl": ["group:staff"]}),
            ):
                answered = client.request(method, path, headers=admin, json=body)
                assert answered.status_code == 404, (method, path, answered.text)
                assert answered.headers["content-type"] == "application/problem+json"
        for doc_id, version in (("a%00b", None), ("handbook", "\x00")):
            acl = client.put(
                f"/admin/documents/{doc_id}/acl",
                headers={**admin, "content-type": "application/json"},
                content=json.dumps({"acl": ["group:staff"], "version": version}),
            )
            assert acl.status_code == 404, acl.text
        explained = client.post(
            "/admin/explain",
            headers={**admin, "content-type": "application/json"},
            content=json.dumps({"doc_id": "a\x00b", "subject": {"sub": "x", "tenant": "acme"}}),
        )
        assert explained.status_code == 404, explained.text
        # Authentication still comes first.
        assert client.get(f"/admin/jobs/{UNSTORABLE[0]}").status_code == 401
        assert client.get(f"/documents/{UNSTORABLE[0]}").status_code == 401


def test_identifiers_ingest_accepts_are_all_found(
    tmp_path: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    """The first check took every identifier that is not `str.isprintable` for one no
    write could have made: documents named with a no-break space, a zero-width joiner or
    an ideographic space were searchable, and could be neither read nor deleted."""
    ids = ["a\u00a0b", "café\u200dx", "日本\u3000語", "soft\u00adhyphen", "x" * 1024]
    docs = tmp_path / "docs"
    for n, doc_id in enumerate(ids):
        meta = {"doc_id": doc_id, **STAFF_EU, "effective_from": "2020-01-01"}
        write_doc(docs, f"{n}.md", meta, f"Pelican quota rule {n}.")
    layout = DataLayout(tmp_path / "data")
    ingest_paths([docs], layout, embedder)
    settings = make_settings(layout.root, jwks_file, write_policy(tmp_path / "policy"))
    alice, admin = bearer(make_token(**ALICE)), bearer(make_token(**ROOT))
    with TestClient(create_app(settings, embedder=embedder)) as client:
        for doc_id in ids:
            path = quote(doc_id, safe="")
            shown = client.get(f"/documents/{path}", headers=alice)
            assert shown.status_code == 200 and shown.json()["doc_id"] == doc_id
            chunk = quote(shown.json()["chunk_ids"][0], safe="")
            assert client.get(f"/chunks/{chunk}", headers=alice).status_code == 200
            assert client.delete(f"/admin/documents/{path}", headers=admin).status_code == 200


@pytest.mark.server
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_mcp_fetch_of_an_identifier_no_write_could_make_is_not_found(
    database: str,
    tmp_path: Path,
    jwks_file: Path,
    embedder: Embedder,
    make_token: TokenFactory,
    request: pytest.FixtureRequest,
) -> None:
    """The `fetch` tool looked the ID up unchecked: on PostgreSQL a NUL failed in the
    database, and the model got "Error executing tool fetch" where /documents says 404."""
    url = request.getfixturevalue("postgres").new_database() if database == "postgresql" else ""
    settings = make_settings(tmp_path / "data", jwks_file, write_policy(tmp_path / "policy"))
    app = create_app(settings.model_copy(update={"database_url": url}), embedder=embedder)
    token = make_token(**{**ALICE, "sub": "fetches-nul"})
    with TestClient(app, raise_server_exceptions=False) as client:
        missing = call_tool(client, token, "fetch", id="no-such-document")
        assert missing["isError"] is True and "not found" in missing["content"][0]["text"]
        # (A lone surrogate never reaches the tool: the SDK's JSON parser refuses it.)
        for bad in ("a\x00b", "a\x00b@1:0", "\x1f"):
            assert call_tool(client, token, "fetch", id=bad) == missing, repr(bad)
        state = client.app.state.gateway  # type: ignore[attr-defined]
        assert state.audit.flush()
        rows = state.catalog.audit.find("acme", subject="fetches-nul")
        metrics = client.get("/metrics").text
    assert [(r.route, r.tool, r.status) for r in rows] == [("/mcp", "fetch", 404)] * 4
    assert 'gateway_mcp_tool_calls_total{outcome="tool_error",tool="fetch"} 4.0' in metrics
