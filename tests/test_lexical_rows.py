"""Hits named by their row (a fast field and the partition's rows files) are named exactly
as the document store names them: across writes, deletes, new generations, merged rows
files, lost rows files and partitions written before rows were."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import tantivy

from gateway.domain import Chunk, Visibility, version_key
from gateway.restriction import Restriction
from gateway.storage import rows as rows_module
from gateway.storage.layout import snapshot_lexical
from gateway.storage.lexical import TantivyIndex, _schema
from gateway.storage.partitions import LexicalIndex, _has_deletes, partition_name
from tests.helpers.seaweed import S3Store

TODAY = dt.date(2026, 1, 1)
CALLER = Restriction("acme", frozenset({"group:all"}), frozenset({"EU"}), TODAY)


def chunk(doc: int, ordinal: int, version: str = "1") -> Chunk:
    v = Visibility("acme", "EU", ("group:all",), dt.date(2020, 1, 1), None)
    text = f"refund rule for doc{doc} part{ordinal} version{version}"
    return Chunk(f"d{doc}@{version}:{ordinal}", f"d{doc}", version, ordinal, "t", "", text, 8, v)


def named_as_stored(index: TantivyIndex, query: str, limit: int = 1000) -> list[str]:
    """Every hit's ID, after checking it against the stored chunk with the same words."""
    hits = index.search(CALLER, query, limit)
    stored = index.fetch(CALLER, [h.chunk_id for h in hits])
    for hit in hits:  # the ID names a stored chunk that holds the words the hit matched
        assert hit.chunk_id in stored, hit.chunk_id
        assert f"doc{hit.chunk_id[1 : hit.chunk_id.index('@')]} " in stored[hit.chunk_id].text
    return [h.chunk_id for h in hits]


def key(doc: int, version: str = "1") -> str:
    return version_key("acme", f"d{doc}", version)


def test_hits_are_named_by_row_across_writes_and_deletes(tmp_path: Path) -> None:
    index = TantivyIndex(tmp_path / "p")
    index.apply([], [chunk(d, o) for d in range(40) for o in range(3)])
    index.apply([key(d) for d in range(0, 40, 2)], [chunk(d, 0, "2") for d in range(0, 40, 2)])
    assert len(index._rows or ()) == 140
    ids = named_as_stored(index, "refund")
    assert len(ids) == 20 * 3 + 20  # the deleted versions' rows are named, never returned
    assert not {f"d{d}@1:{o}" for d in range(0, 40, 2) for o in range(3)} & set(ids)
    assert set(named_as_stored(index, "doc7")) == {"d7@1:0", "d7@1:1", "d7@1:2"}
    reopened = TantivyIndex(tmp_path / "p")
    assert named_as_stored(reopened, "refund") == ids


def test_a_new_generation_leaves_the_served_ones_rows_as_they_were(tmp_path: Path) -> None:
    served = TantivyIndex(tmp_path / "g1")
    served.apply([], [chunk(d, 0) for d in range(10)])
    before = sorted((tmp_path / "g1").glob("rows-*.json"))
    contents = [p.read_bytes() for p in before]
    snapshot_lexical(tmp_path / "g1", tmp_path / "g2")
    following = TantivyIndex(tmp_path / "g2")
    following.apply([key(3)], [chunk(d, 0) for d in range(10, 20)])
    assert sorted((tmp_path / "g1").glob("rows-*.json")) == before
    assert [p.read_bytes() for p in before] == contents
    assert set(named_as_stored(TantivyIndex(tmp_path / "g1"), "refund")) == {
        f"d{d}@1:0" for d in range(10)
    }
    assert set(named_as_stored(following, "refund")) == {f"d{d}@1:0" for d in range(20) if d != 3}


def test_a_new_generation_takes_the_row_names_of_the_one_before_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = TantivyIndex(tmp_path / "g1")
    served.apply([], [chunk(d, 0) for d in range(10)])
    served.apply([], [chunk(d, 0) for d in range(10, 15)])
    snapshot_lexical(tmp_path / "g1", tmp_path / "g2")
    TantivyIndex(tmp_path / "g2").apply([key(3)], [chunk(d, 0) for d in range(15, 20)])
    parsed: list[int] = []
    loads = json.loads

    def counted(data: str | bytes) -> object:
        if isinstance(data, bytes):  # a rows file (meta.json is read as text)
            parsed.append(len(data))
        return loads(data)

    monkeypatch.setattr(json, "loads", counted)
    following = TantivyIndex(tmp_path / "g2", previous=TantivyIndex(tmp_path / "g1"))

    assert len(parsed) == 2 + 1  # the one before parsed its two files; this one only its own
    fresh = TantivyIndex(tmp_path / "g2")
    assert following._rows is not None and fresh._rows is not None
    assert following._rows._names == fresh._rows._names
    assert set(named_as_stored(following, "refund")) == {f"d{d}@1:0" for d in range(20) if d != 3}


def test_many_writes_merge_their_rows_files_without_changing_a_name(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(rows_module, "MERGE_FROM", 4)
    index = TantivyIndex(tmp_path / "p")
    for d in range(11):
        index.apply([], [chunk(d, 0), chunk(d, 1)])
    files = sorted(p.name for p in (tmp_path / "p").glob("rows-*.json"))
    assert len(files) < 4, files
    expected = {f"d{d}@1:{o}" for d in range(11) for o in range(2)}
    assert set(named_as_stored(index, "refund")) == expected
    assert set(named_as_stored(TantivyIndex(tmp_path / "p"), "refund")) == expected


def test_rows_files_lost_or_damaged_are_read_from_the_store(tmp_path: Path) -> None:
    path = tmp_path / "p"
    index = TantivyIndex(path)
    index.apply([], [chunk(d, 0) for d in range(5)])
    index.apply([], [chunk(d, 0) for d in range(5, 10)])
    [first] = path.glob("rows-0-5-*.json")
    [second] = path.glob("rows-5-5-*.json")
    kept = first.read_text()
    expected = {f"d{d}@1:0" for d in range(10)}
    second.write_text(json.dumps(["d0@1:0"] * 5))  # not the bytes its digest names
    assert len(TantivyIndex(path)._rows or ()) == 5
    assert set(named_as_stored(TantivyIndex(path), "refund")) == expected
    first.write_text("not json")
    assert len(TantivyIndex(path)._rows or ()) == 0
    assert set(named_as_stored(TantivyIndex(path), "refund")) == expected
    first.unlink()  # a gap: nothing after it is trusted either
    second.write_text(kept)
    assert len(TantivyIndex(path)._rows or ()) == 0
    assert set(named_as_stored(TantivyIndex(path), "refund")) == expected


def test_a_partition_written_before_rows_keeps_its_schema_and_answers(tmp_path: Path) -> None:
    path = tmp_path / "old"
    path.mkdir()
    tantivy.Index(_schema(rows=False), path=str(path))  # as an earlier release made it
    index = TantivyIndex(path)
    index.apply([], [chunk(d, 0) for d in range(6)])
    index.apply([key(2)], [chunk(2, 0, "2")])
    meta = json.loads((path / "meta.json").read_text())
    assert "row" not in {field["name"] for field in meta["schema"]}
    assert not list(path.glob("rows-*.json"))
    expected = {f"d{d}@1:0" for d in range(6) if d != 2} | {"d2@2:0"}
    assert set(named_as_stored(TantivyIndex(path), "refund")) == expected


def test_whole_document_hits_are_named_by_row(tmp_path: Path) -> None:
    documents = TantivyIndex(tmp_path / "d", documents=True)
    documents.apply([], [chunk(d, 0) for d in range(8)])
    documents.apply([key(5)], [])
    hits = documents.search(CALLER, "refund", 100)
    assert {h.chunk_id for h in hits} == {f"d{d}@1:0" for d in range(8) if d != 5}
    assert [h.chunk_id for h in documents.search(CALLER, "doc6", 100)] == ["d6@1:0"]


def test_an_erasure_leaves_no_rows_file_naming_a_deleted_chunk(tmp_path: Path) -> None:
    """A segment whose every document is deleted is dropped whole, so no delete is left to
    see; its rows still name the chunk until the erasure writes the partition again."""
    lexical = LexicalIndex(tmp_path / "g")
    lexical.apply([], [chunk(0, 0)])
    lexical.apply([], [chunk(1, 0)])
    lexical.apply([key(1)], [chunk(2, 0)])
    partitions = [p for p in (tmp_path / "g").iterdir() if p.is_dir()]
    assert len(partitions) == 2  # the chunks' and the whole documents'
    assert all(not _has_deletes(p) for p in partitions)
    other = replace(chunk(9, 0), visibility=replace(chunk(9, 0).visibility, tenant="globex"))
    lexical.apply([], [other])  # a tenant with nothing deleted: its partitions stay
    kept = {
        p: p.stat().st_mtime_ns
        for p in (tmp_path / "g").iterdir()
        if p.is_dir() and p not in partitions
    }
    assert len(kept) == 2

    def names(directory: Path) -> list[str]:
        return [n for f in sorted(directory.glob("rows-*.json")) for n in json.loads(f.read_text())]

    assert all("d1@1:0" in names(p) for p in partitions)
    live = {"acme": [chunk(0, 0), chunk(2, 0)], "globex": [other]}
    assert lexical.erase(["acme", "globex"], lambda tenant: [live[tenant]]) == 1
    for partition in partitions:
        assert sorted(names(partition)) == ["d0@1:0", "d2@1:0"]
    assert {p: p.stat().st_mtime_ns for p in kept} == kept
    assert {h.chunk_id for h in LexicalIndex(tmp_path / "g").search(CALLER, "refund", 10)} == {
        "d0@1:0",
        "d2@1:0",
    }


@pytest.mark.server
def test_a_replica_links_the_rows_files_it_holds_instead_of_fetching_them(
    s3: S3Store, tmp_path: Path
) -> None:
    store = s3.object_store()
    writer, replica = tmp_path / "writer", tmp_path / "replica"
    LexicalIndex(writer / "g1").apply([], [chunk(d, 0) for d in range(5)])
    snapshot_lexical(writer / "g1", writer / "g2")
    LexicalIndex(writer / "g2").apply([], [chunk(d, 0) for d in range(5, 8)])
    for name in ("g1", "g2"):
        store.publish(writer / name, f"lexical/{name}")
    replica.mkdir()
    store.fetch("lexical/g1", replica / "g1")
    store.fetch("lexical/g2", replica / "g2", reuse=replica / "g1")

    def inodes(root: Path) -> dict[Path, int]:
        return {p.relative_to(root): p.stat().st_ino for p in root.rglob("rows-*.json")}

    before, after = inodes(replica / "g1"), inodes(replica / "g2")
    assert before and all(after[name] == inode for name, inode in before.items())
    assert len(after) == 2 * len(before)  # each partition's new rows came from the store
    served = TantivyIndex(replica / "g2" / partition_name("acme"))
    assert set(named_as_stored(served, "refund")) == {f"d{d}@1:0" for d in range(8)}


def test_reading_opens_only_a_partition_on_disk_and_never_makes_one_again(
    tmp_path: Path,
) -> None:
    """A generation pruned or erased while a search, or the warm, opens one of its
    partitions must not be made again: opening made the directory (and the generation's
    above it) and wrote an empty index into it. A search then finds no partition, as it
    would have a moment later."""
    gone = tmp_path / "generation" / "gone"
    with pytest.raises(FileNotFoundError):
        TantivyIndex(gone, create=False)
    assert not gone.parent.exists()
    lexical = LexicalIndex(tmp_path / "g2")
    lexical.apply([], [chunk(1, 0)])
    partition = lexical.path / partition_name("acme")
    fresh = LexicalIndex(lexical.path)
    assert partition.exists()  # listed, then removed before the search opens it:
    shutil.rmtree(partition)
    assert fresh.fetch(CALLER, ["d1@1:0"]) == {}
    assert fresh.search(CALLER, "refund", 10) == []
    assert not partition.exists()
    TantivyIndex(tmp_path / "p").apply([], [chunk(0, 0)])  # a write makes its directory
    assert named_as_stored(TantivyIndex(tmp_path / "p", create=False), "refund") == ["d0@1:0"]
