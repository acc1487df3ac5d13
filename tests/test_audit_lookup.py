"""Reading the audit trail at scale, and what writes leave in it: `GET /admin/audit` finds a
document's records through an index (never a scan of every record's JSON), lists a bounded
window by default, runs its query off the event loop, and the write routes' records name
the documents, versions and job they changed."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.storage import schema
from gateway.storage.audit import AuditRecord
from gateway.storage.catalog import open_engine
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ROOT
from tests.helpers.documents import doc, write_corpus
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.policies import write_policy
from tests.helpers.postgres import Cluster


def record(subject: str, doc_ids: tuple[str, ...], days_ago: float = 0, **more: Any) -> Any:
    moment = dt.datetime.now(dt.UTC) - dt.timedelta(days=days_ago)
    return AuditRecord(
        time=moment,
        tenant=more.pop("tenant", "acme"),
        subject=subject,
        route="/search",
        status=200,
        duration_ms=1.0,
        doc_ids=doc_ids,
        **more,
    )


def test_the_doc_id_filter_reads_the_document_index(tmp_path: Path) -> None:
    catalog = DataLayout(tmp_path / "data").open_catalog()
    catalog.audit.write(
        [
            record("a", ("policy",)),
            record("b", ("policy-2", "x")),  # an ID that merely starts like it
            record("c", ('"policy"',)),  # one that quotes it
            record("d", ("policy",), tenant="globex"),  # another tenant's
            record("e", ("x", "policy")),
        ]
    )
    statements: list[tuple[str, Any]] = []

    def seen(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        statements.append((statement, parameters))

    event.listen(catalog.engine, "before_cursor_execute", seen)
    try:
        found = catalog.audit.find(
            "acme", doc_id="policy", since=dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
        )
    finally:
        event.remove(catalog.engine, "before_cursor_execute", seen)
    assert [r.subject for r in found] == ["e", "a"]  # exact ID, this tenant, newest first

    (statement, parameters), *_ = [s for s in statements if "FROM audit" in s[0]]
    with catalog.engine.connect() as connection:
        plan = connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
    steps = " | ".join(str(row[-1]) for row in plan)
    assert "ix_audit_docs_lookup" in steps, steps
    assert "SCAN audit" not in steps, steps  # no pass over every record


def written_and_found(root: Path, url: str) -> list[tuple[str, list[str]]]:
    """A batch whose records repeat a document ID, name none, or share one, written
    and each document's records read back through the document index."""
    catalog = DataLayout(root, url).open_catalog()
    catalog.audit.write(
        [
            record("a", ("policy", "x", "policy")),  # the same ID twice: one row
            record("b", ()),
            record("c", ("x",)),
        ]
    )
    catalog.audit.write([record("d", ("policy",))])  # another batch, after
    since = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    return [
        (doc_id, [r.subject for r in catalog.audit.find("acme", doc_id=doc_id, since=since)])
        for doc_id in ("policy", "x", "absent")
    ]


FOUND = [("policy", ["d", "a"]), ("x", ["c", "a"]), ("absent", [])]


def test_a_batch_indexes_each_records_documents_once(tmp_path: Path) -> None:
    assert written_and_found(tmp_path, f"sqlite:///{tmp_path / 'catalog.db'}") == FOUND


def test_a_batch_indexes_each_records_documents_once_on_postgres(
    tmp_path: Path, postgres: Cluster
) -> None:
    assert written_and_found(tmp_path, postgres.new_database()) == FOUND


def upgraded_trail_finds(root: Path, url: str) -> list[str]:
    """Records written before migration 0007, found by doc_id once it has run."""
    engine = open_engine(url)
    schema.upgrade(engine, "0006")
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO audit (time, tenant, subject, route, status, doc_ids_json, "
            "chunk_ids_json, degraded_json, duration_ms) VALUES "
            "(CURRENT_TIMESTAMP, 'acme', 'before', '/search', 200, '[\"policy\", \"x\"]', "
            "'[]', '[]', 1), "
            "(CURRENT_TIMESTAMP, 'acme', 'other', '/search', 200, '[\"x\"]', '[]', '[]', 1)"
        )
    schema.upgrade(engine)
    catalog = DataLayout(root, url).open_catalog()
    since = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    return [r.subject for r in catalog.audit.find("acme", doc_id="policy", since=since)]


def test_the_upgrade_indexes_the_records_already_kept(tmp_path: Path) -> None:
    assert upgraded_trail_finds(tmp_path, f"sqlite:///{tmp_path / 'catalog.db'}") == ["before"]


def test_the_upgrade_indexes_the_records_already_kept_on_postgres(
    tmp_path: Path, postgres: Cluster
) -> None:
    assert upgraded_trail_finds(tmp_path, postgres.new_database()) == ["before"]


@pytest.fixture
def served(
    tmp_path: Path, jwks_file: Path, embedder: Embedder
) -> Iterator[tuple[TestClient, DataLayout]]:
    layout = DataLayout(tmp_path / "data")
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    settings = make_settings(layout.root, jwks_file, write_policy(tmp_path / "policy"))
    with TestClient(create_app(settings, embedder=embedder)) as client:
        yield client, layout


def listed(client: TestClient, token: str, **query: Any) -> list[dict[str, Any]]:
    client.app.state.gateway.audit.flush()  # type: ignore[attr-defined]  # what the thread would
    response = client.get("/admin/audit", params=query, headers=bearer(token))
    assert response.status_code == 200, response.text
    return list(response.json()["records"])


def test_without_since_the_last_seven_days_are_listed(
    served: tuple[TestClient, DataLayout], make_token: TokenFactory
) -> None:
    client, layout = served
    layout.open_catalog().audit.write(
        [record("old", ("policy",), days_ago=8), record("recent", ("policy",), days_ago=6)]
    )
    root = make_token(**ROOT)
    assert [r["subject"] for r in listed(client, root, doc_id="policy")] == ["recent"]
    since = (dt.datetime.now(dt.UTC) - dt.timedelta(days=30)).isoformat()
    both = listed(client, root, doc_id="policy", since=since)
    assert [r["subject"] for r in both] == ["recent", "old"]
    until = (dt.datetime.now(dt.UTC) - dt.timedelta(days=7)).isoformat()
    before = listed(client, root, doc_id="policy", until=until)  # 7 days before `until`
    assert [r["subject"] for r in before] == ["old"]


def test_a_subject_is_found_however_its_accents_are_spelled_and_at_any_length(
    served: tuple[TestClient, DataLayout], make_token: TokenFactory
) -> None:
    """Subjects are recorded in NFC, as every door compares names: "zoë" sent with a
    combining accent (NFD) by its identity provider is found by that spelling too, as is
    one an earlier release recorded as sent. A subject or doc_id as long as a record may
    hold (1,024 bytes) can be asked for; a longer one finds nothing."""
    client, layout = served
    composed, decomposed = "zo\u00eb", "zoe\u0308"
    long_subject, long_doc = "s" * 1024, "d" * 1024
    layout.open_catalog().audit.write(
        [
            record(composed, ("policy",)),
            record(decomposed, ("policy",)),  # as an earlier release kept it
            record(long_subject, (long_doc,)),
        ]
    )
    root = make_token(**ROOT)
    for asked in (composed, decomposed):
        assert sorted(r["subject"] for r in listed(client, root, subject=asked)) == sorted(
            [composed, decomposed]
        )
    assert [r["subject"] for r in listed(client, root, subject=long_subject)] == [long_subject]
    assert [r["subject"] for r in listed(client, root, doc_id=long_doc)] == [long_subject]
    assert listed(client, root, subject="s" * 1025) == []
    assert listed(client, root, doc_id="d" * 1025) == []


@pytest.mark.parametrize(
    "query",
    [
        {"until": "0001-01-01T00:00:00"},
        {"until": "0001-01-03T00:00:00+05:00"},
        {"since": "9999-12-31T23:59:59-05:00"},
        {"since": "0001-01-01T00:00:00+05:00"},
    ],
)
def test_a_moment_at_the_ends_of_the_calendar_is_422_not_500(
    served: tuple[TestClient, DataLayout], make_token: TokenFactory, query: dict[str, str]
) -> None:
    """Near year 1 or 9999 a zone's offset, the 7-day window or the database's binding
    overflowed: a 500."""
    client, _ = served
    response = client.get("/admin/audit", params=query, headers=bearer(make_token(**ROOT)))
    assert response.status_code == 422, response.text
    assert "between 1970 and 9000" in response.text


def test_healthz_answers_while_an_audit_query_runs(
    served: tuple[TestClient, DataLayout], make_token: TokenFactory
) -> None:
    client, _ = served
    trail = client.app.state.gateway.catalog.audit  # type: ignore[attr-defined]
    real_find = trail.find
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()

    def slow_find(*args: Any, **kwargs: Any) -> Any:  # a query over a very long trail
        entered.set()
        release.wait(5)
        try:
            return real_find(*args, **kwargs)
        finally:
            returned.set()

    trail.find = slow_find
    root = bearer(make_token(**ROOT))
    statuses: list[int] = []
    reader = threading.Thread(
        target=lambda: statuses.append(client.get("/admin/audit", headers=root).status_code)
    )
    reader.start()
    try:
        assert entered.wait(10)
        health = client.get("/healthz")
        assert health.status_code == 200
        assert not returned.is_set(), "/healthz waited for the audit query"
    finally:
        release.set()
        reader.join()
    assert statuses == [200]


def test_writes_leave_their_documents_versions_and_job_in_the_trail(
    served: tuple[TestClient, DataLayout], make_token: TokenFactory
) -> None:
    client, _ = served
    root = make_token(**ROOT)
    admin = bearer(root)
    pushed = client.post(
        "/admin/documents", json={"documents": [doc("pelican", version="3")]}, headers=admin
    )
    assert pushed.status_code == 202, pushed.text
    changed = client.put("/admin/documents/loyalty/acl", json={"acl": ["group:ops"]}, headers=admin)
    assert changed.status_code == 200, changed.text
    deleted = client.delete("/admin/documents/refund-policy", headers=admin)
    assert deleted.status_code == 200, deleted.text

    (removal,) = listed(client, root, doc_id="refund-policy")
    assert removal["subject"] == "root" and removal["route"] == "/admin/documents/{doc_id}"
    assert removal["status"] == 200 and removal["doc_ids"] == ["refund-policy"]
    assert removal["versions"] == ["refund-policy@1", "refund-policy@2"]
    assert removal["index_generation"] == deleted.json()["index_generation"]
    (acl,) = listed(client, root, doc_id="loyalty")
    assert acl["route"] == "/admin/documents/{doc_id}/acl"
    assert set(acl["versions"]) == {"loyalty@1", "loyalty@2"}
    (push,) = listed(client, root, doc_id="pelican")
    assert push["route"] == "/admin/documents" and push["versions"] == ["pelican@3"]
    assert push["job_id"] == pushed.json()["job_id"]
    assert "pelican quota" not in str(push)  # IDs only, never the text

    missing = client.delete("/admin/documents/never-was", headers=admin)
    assert missing.status_code == 404
    (attempt,) = listed(client, root, doc_id="never-was")  # a refused delete is on record too
    assert attempt["status"] == 404 and attempt["subject"] == "root"
