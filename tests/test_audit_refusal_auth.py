"""While audit records are refused, a route that requires one authenticates its caller
once: the guard that decides between the 503 and the route used to verify the key (or
token, and ask the directory) and the route then did it all again, doubling the catalog's
look-ups when it was already under strain."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from gateway.api.app import create_app
from gateway.authn.apikeys import create_key
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.storage.layout import DataLayout
from tests.helpers.documents import write_corpus
from tests.helpers.identity import bearer, make_settings
from tests.helpers.policies import write_policy

pytestmark = pytest.mark.server
QUERY = "how are refunds paid RPL-14"


def test_a_request_served_as_the_audit_database_returns_looks_up_its_key_once(
    tmp_path: Path, jwks_file: Path, embedder: Embedder
) -> None:
    layout = DataLayout(tmp_path / "data")
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    policy = write_policy(tmp_path / "policy", audit={"required": ["/search"]})
    key, _ = create_key(
        layout.open_catalog(), tenant="acme", region="EU", principals=["support:eu"]
    )
    settings = make_settings(layout.root, jwks_file, policy)
    with TestClient(create_app(settings, embedder=embedder)) as client:
        with sqlite3.connect(layout.catalog) as db:  # the database refuses every record
            db.execute("ALTER TABLE audit RENAME TO audit_away")
        deadline = time.monotonic() + 10
        while (
            response := client.post("/search", json={"query": QUERY}, headers=bearer(key))
        ).status_code == 200:
            assert time.monotonic() < deadline, "searches kept being answered without a record"
            time.sleep(0.1)
        assert response.json()["code"] == "audit_unavailable"

        key_lookups = 0

        def counted(*args: Any) -> None:
            nonlocal key_lookups
            if "FROM api_keys" in args[2]:
                key_lookups += 1
                if key_lookups == 1:
                    # The database is back once the first check of this request is under
                    # way: the request is then served, not refused.
                    with sqlite3.connect(layout.catalog) as db:
                        db.execute("ALTER TABLE audit_away RENAME TO audit")

        engine = client.app.state.gateway.catalog.engine  # type: ignore[attr-defined]
        event.listen(engine, "before_cursor_execute", counted)
        served = client.post("/search", json={"query": QUERY}, headers=bearer(key))
        event.remove(engine, "before_cursor_execute", counted)
        assert served.status_code == 200, served.text
        assert key_lookups == 1
