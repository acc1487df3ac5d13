"""Identifiers no write could have made (a NUL, a lone surrogate) name nothing: 404, as a
missing one, on SQLite and on PostgreSQL, which refused a NUL with an error of its own
(a 500) at every route that looked one up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.embedding import Embedder
from tests.helpers.callers import ROOT
from tests.helpers.identity import TokenFactory, bearer, make_settings
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
