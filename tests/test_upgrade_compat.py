"""A data dir written by an earlier release, while that release's servers still serve it
(upgrades stop writers first; servers may keep serving): what this release writes into a
tenant's existing Tantivy partitions stays in the schema those servers open. An earlier
release opens a partition only in its own schema, the one without the `row` fast field
(`_schema(rows=False)`), and fails every search of the tenant otherwise."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
import tantivy
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.domain import Chunk, Visibility
from gateway.embedding import Embedder
from gateway.ingest.erasure import erase
from gateway.ingest.pipeline import delete_versions, ingest_paths
from gateway.restriction import Restriction
from gateway.storage import lexical
from gateway.storage.layout import DataLayout
from gateway.storage.lexical import _schema
from gateway.storage.partitions import (
    DOCUMENTS_PREFIX,
    SYNCED_SUFFIX,
    LexicalIndex,
    partition_name,
)
from tests.helpers.callers import ALICE
from tests.helpers.canary import canary_doc, canary_vectors, scan
from tests.helpers.documents import STAFF_EU, write_doc
from tests.helpers.identity import TokenFactory, bearer, make_settings

ANN = 10_000  # no ANN index at this size


def _written_before_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every partition made from here on is made as an earlier release made it."""
    numbers_rows = lexical.has_rows
    monkeypatch.setattr(lexical, "has_rows", lambda path, new=True: numbers_rows(path, False))


def _fields(partition: Path) -> set[str]:
    return {f["name"] for f in json.loads((partition / "meta.json").read_text())["schema"]}


def _open_as_an_earlier_release(partition: Path) -> None:
    """What a server of an earlier release does with a partition; raises ValueError
    ("Schema error: An index exists but the schema does not match") in another schema."""
    documents = partition.name.startswith(DOCUMENTS_PREFIX)
    tantivy.Index(_schema(documents, rows=False), path=str(partition), reuse=True)


def test_an_erasure_writes_a_partition_of_an_earlier_release_again_in_its_schema(
    tmp_path: Path,
    embedder: Embedder,
    jwks_file: Path,
    make_token: TokenFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layout = DataLayout(tmp_path / "data")
    docs = tmp_path / "docs"
    kept = {"doc_id": "refunds", "title": "Refund policy", "effective_from": "2020-01-01"}
    write_doc(docs, "refunds.md", {**kept, **STAFF_EU}, "Refunds are paid in 5 days (RPL-14).")
    secret = canary_doc(0)
    meta = {k: secret[k] for k in ("doc_id", "title", "region", "acl", "effective_from")}
    write_doc(docs, "canary.md", {**meta, "tenant": "acme"}, secret["text"])
    with monkeypatch.context() as patch:
        _written_before_rows(patch)
        ingest_paths([docs], layout, embedder)

    def partitions() -> list[Path]:
        current = layout.open_catalog().current_generation()
        assert current is not None
        served = layout.local_lexical(current)
        return [served / partition_name("acme", p) for p in ("t-", DOCUMENTS_PREFIX)]

    assert all("row" not in _fields(p) for p in partitions())  # as the earlier release wrote
    vectors = canary_vectors(str(layout.vectors), None, ["canary-0"])
    delete_versions(layout, "acme", "canary-0")
    report = erase(layout, ann_min_rows=ANN)
    assert report.done and report.tenants_rewritten == 1

    erased = scan(layout.root, ["canary-0"], vectors)
    assert erased.empty, erased
    for partition in partitions():  # written again, in the schema it had
        assert "row" not in _fields(partition), partition.name
        assert not list(partition.glob("rows-*.json"))
        _open_as_an_earlier_release(partition)

    alice = bearer(make_token(**ALICE))
    with TestClient(create_app(make_settings(layout.root, jwks_file), embedder=embedder)) as client:
        for body in ({"query": "refunds RPL-14"}, {"query": "refunds", "group_by": "document"}):
            response = client.post("/search", json=body, headers=alice)
            assert response.status_code == 200, response.text
            assert {r["doc_id"] for r in response.json()["results"]} == {"refunds"}
            assert response.json()["degraded"] == []
        words = {"query": secret["text"][:80]}
        response = client.post("/search", json=words, headers=alice)
        assert response.status_code == 200, response.text
        assert "canary-0" not in {r["doc_id"] for r in response.json()["results"]}


def _chunk(doc: int) -> Chunk:
    v = Visibility("acme", "EU", ("group:all",), dt.date(2020, 1, 1), None)
    return Chunk(f"d{doc}@1:0", f"d{doc}", "1", 0, "t", "", f"refund rule {doc}", 3, v)


class _Versions:
    """What the catalog knows of the versions the index holds (`KnownVersions`)."""

    def tenants(self) -> list[str]:
        return ["acme"]

    def visibilities(
        self, tenant: str, versions: set[tuple[str, str]]
    ) -> dict[tuple[str, str], Visibility]:
        return {v: _chunk(0).visibility for v in versions}


def test_a_document_partition_made_beside_chunks_of_an_earlier_release_takes_their_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant whose chunks an earlier release wrote and whose document partition is not
    in step with them gets a new one at the next write: in the chunks' schema."""
    generation = tmp_path / "g"
    with monkeypatch.context() as patch:
        _written_before_rows(patch)
        LexicalIndex(generation).apply([], [_chunk(d) for d in range(3)])
    documents = generation / partition_name("acme", DOCUMENTS_PREFIX)
    (generation / (documents.name + SYNCED_SUFFIX)).unlink()  # behind its chunks

    LexicalIndex(generation).apply([], [_chunk(3)], catalog=_Versions())
    assert "row" not in _fields(documents)
    _open_as_an_earlier_release(documents)
    caller = Restriction("acme", frozenset({"group:all"}), frozenset({"EU"}), dt.date(2026, 1, 1))
    found = LexicalIndex(generation).search_documents(caller, "refund", 10)
    assert found is not None and {h.chunk_id for h in found} == {f"d{d}@1:0" for d in range(4)}
