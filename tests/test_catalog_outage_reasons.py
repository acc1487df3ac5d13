"""A catalog outage says its reason where the database gave one an operator acts on: a
full disk was reported as "the catalog database cannot be reached; retry shortly", in 503s
and command output alike, and sent operators looking for a database that was down. The
code stays `catalog_unavailable` (503, transient): once there is room, a retry succeeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import event

from gateway.embedding import Embedder
from gateway.storage.layout import DataLayout
from tests.helpers.documents import doc
from tests.helpers.identity import bearer
from tests.helpers.postgres import Cluster
from tests.helpers.processes import gateway_env, run_gateway
from tests.helpers.push_app import push_app
from tests.test_cli_errors import KEY

MAX_PAGES = 1_073_741_823  # SQLite's own limit: room again


def test_a_full_catalog_disk_is_said_in_the_503_and_a_retry_succeeds_with_room(
    tmp_path: Path, embedder: Embedder, jwks_file: Path
) -> None:
    with push_app(tmp_path, embedder, jwks_file) as (client, _, key):
        engine = client.app.state.gateway.catalog.engine  # type: ignore[attr-defined]
        room = {"pages": 1}  # at most the file's size now: the next page is refused FULL

        def capped(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
            dbapi_connection.execute(f"PRAGMA max_page_count={room['pages']}")

        event.listen(engine, "checkout", capped)
        pushed = {"documents": [doc("big", text="Pelican quota. " * 20_000)]}  # 300 kB
        try:
            full = client.post("/admin/documents", json=pushed, headers=bearer(key))
            assert full.status_code == 503, full.text
            assert full.headers["content-type"] == "application/problem+json"
            assert full.json()["code"] == "catalog_unavailable"
            assert full.json()["detail"] == "the catalog's disk is full"
            room["pages"] = MAX_PAGES
            taken = client.post("/admin/documents", json=pushed, headers=bearer(key))
            assert taken.status_code == 202, taken.text
        finally:
            event.remove(engine, "checkout", capped)


def test_a_catalog_that_cannot_be_written_is_said_in_the_503_and_a_retry_succeeds(
    tmp_path: Path, embedder: Embedder, jwks_file: Path
) -> None:
    """A catalog SQLite may not write (a restore owned by another user, a read-only mount:
    here SQLite's own `query_only`, which refuses a write as such a file does) was a 500 once
    only real outages were `catalog_unavailable`."""
    with push_app(tmp_path, embedder, jwks_file) as (client, _, key):
        engine = client.app.state.gateway.catalog.engine  # type: ignore[attr-defined]
        writable = {"now": False}

        def read_only(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
            dbapi_connection.execute(f"PRAGMA query_only={0 if writable['now'] else 1}")

        event.listen(engine, "checkout", read_only)
        pushed = {"documents": [doc("pelican-read-only")]}
        try:
            refused = client.post("/admin/documents", json=pushed, headers=bearer(key))
            assert refused.status_code == 503, refused.text
            assert refused.json()["code"] == "catalog_unavailable"
            assert refused.json()["detail"] == (
                "the catalog cannot be written (read-only: check the data dir's owner and mount)"
            )
            writable["now"] = True
            taken = client.post("/admin/documents", json=pushed, headers=bearer(key))
            assert taken.status_code == 202, taken.text
        finally:
            event.remove(engine, "checkout", read_only)


def test_a_database_server_with_a_full_disk_is_said_by_the_command(
    tmp_path: Path, postgres: Cluster
) -> None:
    url = postgres.new_database()
    DataLayout(tmp_path, url).open_catalog()  # the schema
    # The server's own answer when it cannot extend a file, SQLSTATE 53100 (disk_full),
    # given by the server for every new key, as a full disk would.
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as db:
        db.execute(
            "CREATE FUNCTION disk_full() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "RAISE EXCEPTION 'could not extend file' USING ERRCODE = '53100'; END $$"
        )
        db.execute(
            "CREATE TRIGGER disk_full BEFORE INSERT ON api_keys "
            "FOR EACH ROW EXECUTE FUNCTION disk_full()"
        )
    failed = run_gateway(*KEY, env=gateway_env(GATEWAY_DATABASE_URL=url))
    assert failed.returncode == 1
    assert failed.stderr == "catalog_unavailable: the database server's disk is full\n"
