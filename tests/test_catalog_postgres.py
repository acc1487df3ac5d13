"""The catalog on a real PostgreSQL (a throwaway cluster on loopback): created by the same
migrations as SQLite's, the whole path served from it (ingest, restricted search, the push
API's jobs, ACL changes, deletes, keys), and a database that goes away answered 503
`catalog_unavailable`, recovering by itself when it is back."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError
from sqlmodel import SQLModel

from gateway.api.app import create_app
from gateway.authn.apikeys import create_key
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.ingest.worker import IngestWorker
from gateway.policy.loader import load_policy
from gateway.storage import schema
from gateway.storage.catalog import open_engine
from gateway.storage.directory import UserFields
from gateway.storage.erasures import Erasures
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ALICE, ROOT
from tests.helpers.documents import doc, write_corpus
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.policies import write_policy
from tests.helpers.postgres import Cluster, throwaway_cluster


def test_migrations_make_the_models_schema_on_postgres(tmp_path: Path, postgres: Cluster) -> None:
    catalog = DataLayout(tmp_path, postgres.new_database()).open_catalog()
    with catalog.engine.connect() as connection:
        assert schema.revision_of(connection) == schema.head()
        assert compare_metadata(MigrationContext.configure(connection), SQLModel.metadata) == []


def test_a_catalog_at_0008_upgrades_to_the_erasure_requests_on_postgres(
    postgres: Cluster,
) -> None:
    engine = open_engine(postgres.new_database())
    schema.upgrade(engine, "0008")
    assert schema.upgrade(engine) == ("0008", schema.head())
    with engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), SQLModel.metadata) == []
    erasures = Erasures(engine)
    seq = erasures.request("acme", "operator")
    assert [r.seq for r in erasures.open()] == [seq]


def test_the_whole_path_runs_on_postgres(
    postgres: Cluster, tmp_path: Path, embedder: Embedder, jwks_file: Path, make_token: TokenFactory
) -> None:
    url = postgres.new_database()
    layout = DataLayout(tmp_path / "data", url)
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    assert not layout.catalog.exists()  # nothing of the catalog is in the data dir
    policy_dir = write_policy(tmp_path / "policy")
    settings = make_settings(layout.root, jwks_file, policy_dir).model_copy(
        update={"database_url": url}
    )
    key, row = create_key(
        layout.open_catalog(), tenant="acme", region="EU", principals=[], scope="ingest"
    )
    writer = IngestWorker(layout, embedder, lambda: load_policy(policy_dir).policy)
    alice = bearer(make_token(**ALICE))
    with TestClient(create_app(settings, embedder=embedder)) as client:

        def found(query: str) -> set[str]:
            response = client.post("/search", json={"query": query}, headers=alice)
            assert response.status_code == 200, response.text
            return {r["doc_id"] for r in response.json()["results"]}

        assert "refund-policy" in found("refunds paid RPL-14")
        assert "board-minutes" not in found("board minutes")  # restricted as on SQLite
        # An answer reads its evidence's chunks and sentence vectors from PostgreSQL too.
        answered = client.post(
            "/answer", json={"query": "How quickly are refunds paid?"}, headers=alice
        )
        assert answered.status_code == 200, answered.text
        assert "5 days" in answered.json()["answer"]
        assert "refund-policy@2:0" in {c["chunk_id"] for c in answered.json()["citations"]}
        queued = client.post(
            "/admin/documents", json={"documents": [doc("pelican-pg")]}, headers=bearer(key)
        )
        assert queued.status_code == 202
        assert writer.run_once() == 1
        job = client.get(f"/admin/jobs/{queued.json()['job_id']}", headers=bearer(key)).json()
        assert job["status"] == "succeeded" and job["chunks"] == 1
        deadline = time.monotonic() + 5  # a new generation is served within 5 s (polled)
        while "pelican-pg" not in found("pelican quota"):
            assert time.monotonic() < deadline, "the new generation was not served in 5 s"
            time.sleep(0.1)
        revoked = client.put(
            "/admin/documents/pelican-pg/acl",
            json={"acl": ["group:board"]},
            headers=bearer(make_token(**ROOT)),
        )
        assert revoked.status_code == 200
        assert "pelican-pg" not in found("pelican quota")  # the next request
        # An ingest key deletes what it pushed, not what `gateway ingest` wrote.
        not_its = client.delete("/admin/documents/refund-policy", headers=bearer(key))
        assert not_its.status_code == 403 and not_its.json()["code"] == "not_owner"
        assert client.delete("/admin/documents/pelican-pg", headers=bearer(key)).status_code == 200
        assert layout.open_catalog().owners.adopt("acme", f"key:{row.key_id}", "refund-", True) == 2
        assert (
            client.delete("/admin/documents/refund-policy", headers=bearer(key)).status_code == 200
        )
        assert "refund-policy" not in found("refunds paid RPL-14")


def test_a_database_that_goes_away_is_503_and_comes_back_without_a_restart(
    tmp_path: Path, embedder: Embedder, jwks_file: Path, make_token: TokenFactory
) -> None:
    with throwaway_cluster() as cluster:  # its own: this test stops it
        url = cluster.new_database()
        layout = DataLayout(tmp_path / "data", url)
        ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
        settings = make_settings(layout.root, jwks_file).model_copy(update={"database_url": url})
        alice = bearer(make_token(**ALICE))
        with TestClient(create_app(settings, embedder=embedder)) as client:
            assert (
                client.post("/search", json={"query": "refunds"}, headers=alice).status_code == 200
            )
            cluster.stop()
            for path in ("/readyz",):
                down = client.get(path)
                assert down.status_code == 503 and down.json()["code"] == "catalog_unavailable"
            deadline = time.monotonic() + 5  # a search may use the watcher's last poll (0.2 s)
            while (
                down := client.post("/search", json={"query": "refunds"}, headers=alice)
            ).status_code == 200:
                assert time.monotonic() < deadline, "searches did not notice"
                time.sleep(0.05)
            assert down.status_code == 503, down.text
            assert down.json()["code"] == "catalog_unavailable"
            assert down.headers["content-type"] == "application/problem+json"
            cluster.start()
            back = client.post("/search", json={"query": "refunds"}, headers=alice)
            assert back.status_code == 200, back.text
            assert client.get("/readyz").status_code == 200


def test_a_statement_postgresql_refuses_is_its_own_error_not_an_outage(
    tmp_path: Path, postgres: Cluster
) -> None:
    """PostgreSQL refuses a B-tree entry over 2,704 bytes (SQLSTATE 54000, an
    OperationalError). Reported as `catalog_unavailable`, a write that can never succeed
    was retried for ever, and the operator looked for an outage that was not there."""
    directory = DataLayout(tmp_path, postgres.new_database()).open_catalog().directory
    unindexable = "".join(chr(0x4E00 + (i * 7919) % 0x5000) for i in range(1000))  # 3,000 B
    with pytest.raises(OperationalError) as refused:
        directory.create_user("acme", UserFields(unindexable))
    assert isinstance(refused.value.orig, psycopg.errors.ProgramLimitExceeded)
    kim, _ = directory.create_user("acme", UserFields("kim"))  # the database is there
    assert directory.user("acme", kim.id) is not None
