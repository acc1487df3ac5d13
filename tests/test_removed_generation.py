"""A generation removed from disk under the searches that hold it (pruned after newer ones,
or freed after an erasure) must not answer "nothing" as if its tenant had no documents:
its lexical lanes fail and say so, and results it can no longer show are a 503 to retry,
never an empty 200."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.ingest.pipeline import ingest_paths, reindex
from gateway.storage import layout as layout_module
from gateway.storage.layout import DataLayout, prune_lexical, remove_generation
from gateway.storage.partitions import GenerationRemoved, LexicalIndex
from tests.helpers.documents import STAFF_EU, write_doc
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.seaweed import S3Store
from tests.test_lexical_rows import CALLER, chunk


def test_a_search_of_a_removed_generation_is_refused_not_answered_empty(
    data_dir: Path, tmp_path: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    # Not warmed: the partitions open on the first search, as in a newer generation that
    # requests search while the watcher still warms it.
    settings = make_settings(copy, jwks_file).model_copy(update={"warm_index": "off"})
    ann = bearer(make_token(sub="ann", tenant="acme", groups=["staff"]))
    with TestClient(create_app(settings, embedder=embedder)) as client:
        served = client.app.state.gateway.indexes.served  # type: ignore[attr-defined]
        assert served is not None and served.lexical.opened == []

        remove_generation(served.lexical.path)

        refused = client.post("/search", json={"query": "refund policy"}, headers=ann)
        assert refused.status_code == 503, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["code"] == "not_ready"
        by_document = client.post(
            "/search", json={"query": "refund policy", "group_by": "document"}, headers=ann
        )
        assert by_document.status_code == 503, by_document.text


def test_lanes_of_a_removed_generation_fail_and_a_partition_opened_before_still_answers(
    tmp_path: Path,
) -> None:
    layout = DataLayout(tmp_path)
    held = LexicalIndex(layout.lexical(1))
    held.apply([], [chunk(1, 0)])
    opened, unopened = LexicalIndex(held.path), LexicalIndex(held.path)
    assert [h.chunk_id for h in opened.search(CALLER, "refund", 10)] == ["d1@1:0"]

    prune_lexical(layout, current=9)  # g1 is past the generations kept

    assert not held.path.exists()
    with pytest.raises(GenerationRemoved):
        unopened.search(CALLER, "refund", 10)
    with pytest.raises(GenerationRemoved):
        unopened.fetch(CALLER, ["d1@1:0"])
    with pytest.raises(GenerationRemoved):
        unopened.search_identifiers(CALLER, "RPL-14", 10)
    # A search that opened its partition before reads it to the end: its files stay open.
    assert [h.chunk_id for h in opened.search(CALLER, "refund", 10)] == ["d1@1:0"]
    assert list(opened.fetch(CALLER, ["d1@1:0"])) == ["d1@1:0"]


def test_a_generation_is_removed_whole_and_a_removal_cut_short_is_finished(
    tmp_path: Path,
) -> None:
    layout = DataLayout(tmp_path)
    for number in (1, 2):
        LexicalIndex(layout.lexical(number)).apply([], [chunk(number, 0)])
    interrupted = layout.lexical_root / ".g000000.removing-4242"  # a crashed process's
    (interrupted / "t-x").mkdir(parents=True)

    prune_lexical(layout, current=4)

    assert sorted(p.name for p in layout.lexical_root.iterdir()) == [layout.lexical(2).name]
    remove_generation(layout.lexical(2))
    remove_generation(layout.lexical(2))  # already gone: another process removed it
    assert list(layout.lexical_root.iterdir()) == []


def _written_generation(tmp_path: Path) -> Path:
    generation = DataLayout(tmp_path).lexical(3)
    LexicalIndex(generation).apply([], [chunk(1, 0)])
    return generation


def test_a_generation_is_gone_from_its_readers_before_anything_in_it_is_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generation = _written_generation(tmp_path)
    deleting: list[tuple[Path, bool]] = []
    rmtree = shutil.rmtree

    def watched(path: Path, **options: bool) -> None:
        deleting.append((Path(path), generation.exists()))
        rmtree(path, **options)

    monkeypatch.setattr(layout_module.shutil, "rmtree", watched)
    remove_generation(generation)

    assert [
        (p.parent, p.name.startswith(".g000003.removing-"), there) for p, there in deleting
    ] == [
        (generation.parent, True, False)  # the name went first, at once
    ]
    assert list(generation.parent.iterdir()) == []


def test_a_generation_that_cannot_be_renamed_is_still_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generation = _written_generation(tmp_path)

    def refused(self: Path, target: Path) -> Path:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "rename", refused)
    remove_generation(generation)
    assert not generation.exists()


@pytest.mark.server
def test_a_second_fetch_of_a_generation_leaves_the_copy_already_in_place(
    s3: S3Store, tmp_path: Path
) -> None:
    """Two processes of a replica host may fetch the same new generation at once: the one
    that comes second must not delete the first one's copy, which may be searched."""
    store = s3.object_store()
    written = LexicalIndex(tmp_path / "writer" / "g1")
    written.apply([], [chunk(d, 0) for d in range(3)])
    store.publish(written.path, "lexical/g1")
    local = tmp_path / "replica" / "g1"
    local.parent.mkdir()
    store.fetch("lexical/g1", local)
    searched = LexicalIndex(local)
    inodes = {p: p.stat().st_ino for p in local.rglob("*") if p.is_file()}

    store.fetch("lexical/g1", local)  # the other process, a moment later

    assert {p: p.stat().st_ino for p in local.rglob("*") if p.is_file()} == inodes
    assert [p.name for p in local.parent.iterdir()] == ["g1"]  # its staging copy gone
    assert len(searched.search(CALLER, "refund", 10)) == 3


def test_a_data_dir_missing_its_served_generation_refuses_to_serve_and_keeps_it_missing(
    data_dir: Path, tmp_path: Path, jwks_file: Path, embedder: Embedder
) -> None:
    """A data dir restored without its current Tantivy generation: `serve` stops with
    `index_invalid` at startup, instead of making the directory again, empty, and
    answering every search with an empty 200."""
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    layout = DataLayout(copy)
    generation = layout.open_catalog().current_generation()
    assert generation is not None
    missing = copy / generation.lexical_dir
    shutil.rmtree(missing)

    app = create_app(make_settings(copy, jwks_file), embedder=embedder)
    with pytest.raises(GatewayError) as refused, TestClient(app):
        pass

    assert refused.value.code == "index_invalid" and not refused.value.transient
    assert f"index generation {generation.id}" in refused.value.detail
    assert "gateway reindex" in refused.value.detail
    assert not missing.exists()


def test_the_writer_builds_no_generation_on_a_missing_one(
    data_dir: Path, tmp_path: Path, embedder: Embedder
) -> None:
    """The next ingest would start from a hard-linked copy of the current generation: with
    that missing it fails with `index_invalid` and commits nothing (a new generation of
    only the new documents would drop every other from BM25); `gateway reindex` builds
    the index again from the catalog."""
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    layout = DataLayout(copy)
    catalog = layout.open_catalog()
    before = catalog.current_generation()
    assert before is not None
    shutil.rmtree(copy / before.lexical_dir)
    pushed = tmp_path / "more"
    pushed.mkdir()
    meta = {**STAFF_EU, "doc_id": "late-note", "effective_from": "2020-01-01"}
    write_doc(pushed, "late.md", meta, "A late note about the harbour.")

    with pytest.raises(GatewayError) as refused:
        ingest_paths([pushed], layout, embedder)

    assert refused.value.code == "index_invalid"
    assert catalog.current_generation_id() == before.id

    reindex(layout, embedder)
    rebuilt = catalog.current_generation()
    assert rebuilt is not None and rebuilt.id > before.id
    assert (copy / rebuilt.lexical_dir).is_dir()
