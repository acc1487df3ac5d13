"""Ingest into real engines: all-or-nothing batches, replacement, supersession, the CLI."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.cli import app as cli
from gateway.domain import Caller
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.ingest.parse import DocumentsRefused
from gateway.ingest.pipeline import delete_versions, ingest_paths
from gateway.restriction import Restriction
from gateway.retrieval.explain import document_versions, explain
from gateway.retrieval.lookup import visible_document
from gateway.storage.layout import DataLayout, ServedIndex, open_served
from tests.helpers.documents import STAFF_EU, tree_digest, write_doc

TODAY = dt.datetime.now(dt.UTC).date()
EVERYONE = Restriction("acme", frozenset({"group:staff"}), frozenset({"EU"}), TODAY)


def served(layout: DataLayout, embedder: Embedder) -> ServedIndex:
    index = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim)
    assert index is not None
    return index


@pytest.fixture()
def layout(tmp_path: Path, embedder: Embedder) -> DataLayout:
    docs = tmp_path / "docs"
    write_doc(
        docs,
        "a.md",
        {"doc_id": "a", **STAFF_EU, "effective_from": "2020-01-01"},
        "Alpha procedures use the code ALP-1 for pallets.",
    )
    write_doc(
        docs,
        "b.md",
        {"doc_id": "b", "version": 1, **STAFF_EU, "effective_from": "2020-01-01"},
        "Bravo procedures mention the zebra crossing near the loading bay.",
    )
    layout = DataLayout(tmp_path / "data")
    ingest_paths([docs], layout, embedder)
    return layout


def test_refused_batch_leaves_the_index_exactly_as_it_was(
    layout: DataLayout, tmp_path: Path, embedder: Embedder
) -> None:
    before = tree_digest(layout.root)
    generation = layout.open_catalog().current_generation()
    documents = layout.open_catalog().all_documents()
    bad = tmp_path / "bad"
    write_doc(
        bad,
        "good.md",
        {"doc_id": "c", **STAFF_EU, "effective_from": "2020-01-01"},
        "A perfectly fine document.",
    )
    write_doc(
        bad,
        "broken.md",
        {"doc_id": "d", "tenant": "acme", "region": "EU", "effective_from": "2020-01-01"},
        "No ACL here.",
    )
    with pytest.raises(DocumentsRefused) as refused:
        ingest_paths([bad], layout, embedder)
    assert "broken.md" in str(refused.value) and "acl" in str(refused.value)
    assert tree_digest(layout.root) == before
    assert layout.open_catalog().current_generation() == generation
    assert layout.open_catalog().all_documents() == documents  # the catalog, by content


def test_reingesting_same_version_replaces_it(
    layout: DataLayout, tmp_path: Path, embedder: Embedder
) -> None:
    docs = tmp_path / "again"
    write_doc(
        docs,
        "b.md",
        {"doc_id": "b", "version": "1", **STAFF_EU, "effective_from": "2020-01-01"},
        "Bravo procedures now mention the giraffe enclosure instead.",
    )
    ingest_paths([docs], layout, embedder)
    index = served(layout, embedder)
    assert index.number == 2
    assert index.lexical.search(EVERYONE, "zebra", 10) == []
    assert [h.chunk_id for h in index.lexical.search(EVERYONE, "giraffe", 10)] == ["b@1:0"]
    assert index.vectors.count() == index.lexical.count() == 2
    # Hits asked to carry their stored fields carry exactly what a fetch reads.
    (hit,) = index.lexical.search(EVERYONE, "giraffe", 10, stored=1)
    assert hit.stored == index.lexical.fetch(EVERYONE, ["b@1:0"])["b@1:0"]
    assert hit.stored is not None and "giraffe enclosure" in hit.stored.text


def test_new_version_closes_the_previous_and_is_recorded(
    layout: DataLayout, tmp_path: Path, embedder: Embedder
) -> None:
    start = TODAY - dt.timedelta(days=3)
    docs = tmp_path / "v2"
    write_doc(
        docs,
        "a2.md",
        {"doc_id": "a", "version": "2", **STAFF_EU, "effective_from": start.isoformat()},
        "Alpha procedures now use the code ALP-2 for pallets.",
    )
    ingest_paths([docs], layout, embedder)
    catalog = layout.open_catalog()
    old = catalog.document("acme", "a", "1")
    assert old is not None
    assert old.effective_to == start - dt.timedelta(days=1) and old.closed_by == "a@2"
    index = served(layout, embedder)
    assert [h.chunk_id for h in index.lexical.search(EVERYONE, "ALP-1 ALP-2", 10)] == ["a@2:0"]
    assert index.vectors.filter_only(EVERYONE) == {"a@2:0", "b@1:0"}


def test_index_built_with_another_model_refuses_to_open(
    layout: DataLayout, embedder: Embedder
) -> None:
    with pytest.raises(GatewayError) as error:
        open_served(layout, layout.open_catalog(), "some/other-model", embedder.dim)
    assert error.value.code == "index_mismatch"


def test_cli_refuses_bad_documents_naming_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"doc_id": "x", "tenant": "acme", "region": "EU", "acl": ["group:a"], '
        '"effective_from": "2020-01-01", "text": "ok"}\n'
        '{"doc_id": "y", "tenant": "acme", "region": "EU", "acl": ["group:a"], '
        '"effective_from": "2020-13-45", "text": "bad date"}\n'
    )
    result = CliRunner().invoke(cli, ["ingest", str(bad), "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 1
    assert f"{bad}:2" in result.output and "effective_from" in result.output
    assert not (tmp_path / "d" / "lexical").exists()


@pytest.mark.model  # the CLI loads the model itself
def test_cli_ingests_and_reports(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    write_doc(
        docs,
        "a.md",
        {"doc_id": "a", **STAFF_EU, "effective_from": "2020-01-01"},
        "Alpha procedures use the code ALP-1 for pallets.",
    )
    result = CliRunner().invoke(cli, ["ingest", str(docs), "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    assert "generation 1: 1 documents, 1 chunks" in result.output


def test_a_version_sent_again_unchanged_changes_nothing(tmp_path: Path, embedder: Embedder) -> None:
    """By content hash, title, uri and visibility: a sync job may resend everything; only
    what changed is embedded and written, and a resend of nothing new spends no generation."""
    docs = tmp_path / "docs"
    meta = {**STAFF_EU, "effective_from": "2020-01-01"}
    write_doc(docs, "a.md", {"doc_id": "a", "version": "1", **meta}, "Alpha rule ALP-1.")
    write_doc(docs, "b.md", {"doc_id": "b", "version": "1", **meta}, "Beta rule BET-1.")
    write_doc(
        docs,
        "a2.md",
        {"doc_id": "a", "version": "2", **meta, "effective_from": "2021-01-01"},
        "Alpha rule ALP-2.",
    )
    layout = DataLayout(tmp_path / "data")
    first = ingest_paths([docs], layout, embedder)
    assert (first.generation, first.documents, first.unchanged) == (1, 3, 0)
    again = ingest_paths([docs], layout, embedder)  # a@1 was closed by a@2: still the same
    assert (again.generation, again.documents, again.unchanged) == (1, 0, 3)
    write_doc(docs, "b.md", {"doc_id": "b", "version": "1", **meta}, "Beta rule BET-2.")
    changed = ingest_paths([docs], layout, embedder)
    assert (changed.generation, changed.documents, changed.unchanged) == (2, 1, 2)
    write_doc(
        docs,
        "b.md",
        {"doc_id": "b", "version": "1", **meta, "acl": ["group:board"]},
        "Beta rule BET-2.",
    )
    assert ingest_paths([docs], layout, embedder).documents == 1  # visibility counts too


def test_a_catalog_named_by_a_sqlite_url_takes_writes(tmp_path: Path, embedder: Embedder) -> None:
    """`GATEWAY_DATABASE_URL=sqlite:///…`, which the settings accept, took PostgreSQL's
    advisory lock for every write: SQLite has no such function, so each ingest, ACL change
    and delete failed `catalog_unavailable` (and the writer retried it without end)."""
    docs = tmp_path / "docs"
    meta = {"doc_id": "a", **STAFF_EU, "effective_from": "2020-01-01"}
    write_doc(docs, "a.md", meta, "Alpha procedures use the code ALP-1 for pallets.")
    root = tmp_path / "data"
    layout = DataLayout(root, f"sqlite:///{root / 'catalog.db'}")
    assert ingest_paths([docs], layout, embedder).chunks >= 1
    assert delete_versions(layout, "acme", "a").deleted == 1
    with pytest.raises(GatewayError) as missing:
        delete_versions(layout, "acme", "a")
    assert missing.value.code == "not_found"


def test_a_correction_starting_the_same_day_replaces_the_version_it_corrects(
    tmp_path: Path, embedder: Embedder
) -> None:
    """`pricing` v1 said the fee is 50 euros, v2 (the same day) 10: both stayed in force,
    and searches and answers cited the two contradicting chunks. And where two versions
    are both in force (explicit dates), `GET /documents` showed v9 over v10 ("9" > "10")."""
    docs, layout = tmp_path / "docs", DataLayout(tmp_path / "data")
    meta = {"doc_id": "pricing", **STAFF_EU, "effective_from": "2020-01-01"}
    write_doc(docs, "p.md", {**meta, "version": 2}, "The fee is 10 euros.")
    ingest_paths([docs], layout, embedder)
    write_doc(docs, "p.md", {**meta, "version": 1}, "The fee is 50 euros.")  # sent late
    ingest_paths([docs], layout, embedder)
    index = served(layout, embedder)
    assert [h.chunk_id for h in index.lexical.search(EVERYONE, "fee euros", 10)] == ["pricing@2:0"]
    write_doc(docs, "p.md", {**meta, "version": 9, "effective_to": "2099-01-01"}, "Fee 9.")
    ingest_paths([docs], layout, embedder)
    write_doc(docs, "p.md", {**meta, "version": 10}, "Fee 10.")
    ingest_paths([docs], layout, embedder)
    caller = Caller("ann", "acme", "EU", frozenset({"group:staff"}), frozenset({"EU"}))
    shown = visible_document(layout.open_catalog(), caller, "pricing", TODAY)
    assert shown is not None and shown.version == "10"
    rows = document_versions(layout.open_catalog(), "pricing", "acme")
    assert explain(rows, caller, TODAY).deciding.version == "10"  # explain agrees
