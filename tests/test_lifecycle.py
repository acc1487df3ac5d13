"""Delete, ACL changes and reindex: each one new generation, exactly the change asked for."""

from __future__ import annotations

import datetime as dt
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from gateway.api.app import create_app
from gateway.bench.server import gateway_command
from gateway.cli import app as cli
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.ingest.pipeline import delete_versions, ingest_paths, reindex, set_acl
from gateway.restriction import Restriction
from gateway.storage.flat import FlatVectors
from gateway.storage.layout import DataLayout, ServedIndex, open_served
from tests.helpers.documents import RISK, STAFF, STAFF_EU, write_doc
from tests.helpers.identity import TokenFactory, bearer, make_settings

pytestmark = pytest.mark.server

TODAY = dt.datetime.now(dt.UTC).date()


def served(layout: DataLayout, embedder: Embedder) -> ServedIndex:
    index = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim)
    assert index is not None
    return index


def visible_ids(layout: DataLayout, embedder: Embedder, restriction: Restriction) -> set[str]:
    return served(layout, embedder).lexical.filter_only(restriction)


@pytest.fixture()
def layout(tmp_path: Path, embedder: Embedder) -> DataLayout:
    docs = tmp_path / "docs"
    old = (TODAY - dt.timedelta(days=400)).isoformat()
    new = (TODAY - dt.timedelta(days=10)).isoformat()
    meta = {"doc_id": "policy", **STAFF_EU}
    write_doc(docs, "v1.md", {**meta, "version": 1, "effective_from": old}, "Old rule OLD-1.")
    write_doc(docs, "v2.md", {**meta, "version": 2, "effective_from": new}, "New rule NEW-2.")
    write_doc(
        docs, "other.md", {"doc_id": "other", **STAFF_EU, "effective_from": old}, "Other OTH-3."
    )
    layout = DataLayout(tmp_path / "data")
    ingest_paths([docs], layout, embedder)
    return layout


def test_deleting_the_newest_version_reopens_the_one_it_closed(
    layout: DataLayout, embedder: Embedder
) -> None:
    assert visible_ids(layout, embedder, STAFF) == {"policy@2:0", "other@1:0"}
    report = delete_versions(layout, "acme", "policy", "2")
    assert (report.generation, report.deleted, report.revised) == (2, 1, 1)
    assert visible_ids(layout, embedder, STAFF) == {"policy@1:0", "other@1:0"}
    row = layout.open_catalog().document("acme", "policy", "1")
    assert row is not None and row.effective_to is None and row.closed_by is None
    assert layout.open_catalog().document("acme", "policy", "2") is None
    delete_versions(layout, "acme", "policy")
    assert visible_ids(layout, embedder, STAFF) == {"other@1:0"}
    assert layout.open_catalog().chunk("acme", "policy@1:0") is None
    with pytest.raises(GatewayError) as error:
        delete_versions(layout, "acme", "policy")
    assert error.value.code == "not_found"


def _row_of(flat: FlatVectors, chunk_id: str) -> int:
    return next(r for r in range(flat.size) if flat.chunk_id(r) == chunk_id)


def test_acl_change_moves_access_without_re_embedding(
    layout: DataLayout, embedder: Embedder
) -> None:
    before = served(layout, embedder)
    vector = before.flat.matrix[_row_of(before.flat, "other@1:0")].copy()
    sentence_vectors = layout.open_catalog().chunk("acme", "other@1:0")
    report = set_acl(layout, "acme", "other", ["group:risk"])
    assert report is not None and report.documents == 0 and report.revised == 1
    assert visible_ids(layout, embedder, STAFF) == {"policy@2:0"}
    assert visible_ids(layout, embedder, RISK) == {"other@1:0"}
    after = served(layout, embedder)
    assert after.vectors.filter_only(RISK) == {"other@1:0"}  # both engines agree
    assert np.array_equal(after.flat.matrix[_row_of(after.flat, "other@1:0")], vector)
    row = layout.open_catalog().chunk("acme", "other@1:0")
    assert row is not None and sentence_vectors is not None
    assert row.sentence_vectors == sentence_vectors.sentence_vectors
    assert (
        set_acl(layout, "acme", "other", ["group:risk"]) is None
    )  # nothing to change, no generation
    with pytest.raises(GatewayError, match="kind:name"):
        set_acl(layout, "acme", "other", ["risk"])
    with pytest.raises(GatewayError, match="no document"):
        set_acl(layout, "acme", "missing", ["group:risk"])
    with pytest.raises(GatewayError, match="no document other@99 in tenant acme"):
        set_acl(layout, "acme", "other", ["group:risk"], version="99")  # named, as deletes are


def test_acl_of_one_version_only(layout: DataLayout, embedder: Embedder) -> None:
    set_acl(layout, "acme", "policy", ["group:risk"], version="1")
    rows = {
        r.version: r.visibility.acl for r in layout.open_catalog().versions_of([("acme", "policy")])
    }
    assert rows == {"1": ("group:risk",), "2": ("group:staff",)}


def test_reindex_embeds_everything_into_a_fresh_table(
    layout: DataLayout, embedder: Embedder
) -> None:
    first = served(layout, embedder)
    report = reindex(layout, embedder)
    assert report.documents == 3
    second = served(layout, embedder)
    assert second.generation.vector_table != first.generation.vector_table
    assert visible_ids(layout, embedder, STAFF) == {"policy@2:0", "other@1:0"}
    row = layout.open_catalog().document("acme", "policy", "1")
    assert row is not None and row.closed_by == "policy@2"  # supersession survives


def test_another_model_is_a_startup_error_until_reindex(
    layout: DataLayout, embedder: Embedder, jwks_file: Path, make_token: TokenFactory
) -> None:
    with sqlite3.connect(layout.catalog) as db:
        db.execute("UPDATE generations SET model_name = 'some/other-model'")
    app = create_app(make_settings(layout.root, jwks_file), embedder=embedder)
    with pytest.raises(GatewayError) as error, TestClient(app):
        pass
    assert error.value.code == "index_mismatch" and "gateway reindex" in error.value.detail
    with pytest.raises(GatewayError, match="gateway reindex"):
        ingest_more(layout, embedder)
    reindex(layout, embedder)
    with TestClient(create_app(make_settings(layout.root, jwks_file), embedder=embedder)) as c:
        response = c.post("/search", json={"query": "NEW-2"}, headers=bearer(make_token()))
        assert response.status_code == 200
        assert response.json()["results"][0]["chunk_id"] == "policy@2:0"


def ingest_more(layout: DataLayout, embedder: Embedder) -> None:
    """An ordinary ingest, which must refuse to mix two models' vectors in one index."""
    docs = layout.root.parent / "more"
    write_doc(docs, "x.md", {"doc_id": "x", **STAFF_EU, "effective_from": "2020-01-01"}, "X.")
    ingest_paths([docs], layout, embedder)


def test_cli_delete_acl_and_reindex(layout: DataLayout) -> None:
    runner = CliRunner()
    data = ["--data-dir", str(layout.root)]
    result = runner.invoke(cli, ["acl", "set", "other", "--acl", "group:risk", *data])
    assert result.exit_code == 0 and "generation 2" in result.output
    result = runner.invoke(cli, ["acl", "set", "other", "--acl", "risk", *data])
    assert result.exit_code == 1 and "kind:name" in result.output
    result = runner.invoke(cli, ["delete", "policy", "--version", "2", *data])
    assert result.exit_code == 0 and "deleted 1 version(s) of policy" in result.output
    result = runner.invoke(cli, ["delete", "nope", *data])
    assert result.exit_code == 1 and "not_found" in result.output
    result = runner.invoke(cli, ["reindex", *data])
    assert result.exit_code == 0 and "re-embedded 2 versions" in result.output


def test_the_generation_a_reader_sees_follows_every_commit_of_another_process(
    layout: DataLayout, embedder: Embedder
) -> None:
    """The reader's cached answer (kept while SQLite's data_version is unchanged) never
    outlives a commit made elsewhere: each `gateway` command below is its own process."""
    reader = layout.open_catalog()
    assert reader.current_generation_id() == reader.current_generation_id() == 1
    data = ["--data-dir", str(layout.root)]
    commands = (["acl", "set", "other", "--acl", "group:risk"], ["delete", "policy"])
    for expected, command in enumerate(commands, start=2):
        done = subprocess.run([gateway_command(), *command, *data], capture_output=True)
        assert done.returncode == 0, done.stderr
        assert reader.current_generation_id() == expected


def test_a_commit_by_another_connection_of_the_same_process_is_seen(
    layout: DataLayout, embedder: Embedder
) -> None:
    reader = layout.open_catalog()
    assert reader.current_generation_id() == 1
    set_acl(layout, "acme", "other", ["group:risk"])
    assert reader.current_generation_id() == 2


def test_a_generation_that_cannot_be_served_fails_closed_while_serving(
    layout: DataLayout, embedder: Embedder, jwks_file: Path, make_token: TokenFactory
) -> None:
    """Serving the previous generation would keep what the new one revoked (search would
    follow old ACLs while /documents follows the catalog): retrieval and readiness fail."""
    with TestClient(create_app(make_settings(layout.root, jwks_file), embedder=embedder)) as c:
        token = bearer(make_token())
        assert c.post("/search", json={"query": "NEW-2"}, headers=token).status_code == 200
        # A revocation, in a new generation that this server cannot serve. The row says so
        # from its commit on: changed afterwards, the server's watcher could open the
        # generation first (it maps the copy the writer built, in milliseconds).
        with sqlite3.connect(layout.catalog) as db:
            db.execute(
                "CREATE TRIGGER other_model AFTER INSERT ON generations WHEN NEW.id = 2 BEGIN "
                "UPDATE generations SET model_name = 'some/other-model' WHERE id = 2; END"
            )
        set_acl(layout, "acme", "policy", ["group:risk"])
        refused = c.post("/search", json={"query": "NEW-2"}, headers=token)
        assert refused.status_code == 503 and refused.json()["code"] == "not_ready"
        assert "generation 2" in refused.json()["detail"]
        assert "other-model" not in refused.text  # the public reason names no model
        assert c.get("/readyz").status_code == 503
        answered = c.post("/answer", json={"query": "NEW-2"}, headers=token)
        assert answered.status_code == 503
