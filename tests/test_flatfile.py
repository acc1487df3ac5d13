"""The vector copy kept as files: a new generation reads only the vectors it adds, a restart
maps the copy instead of reading the table, and a half-written copy is never mapped."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from gateway.embedding import Embedder
from gateway.ingest.pipeline import delete_versions, ingest_paths, set_acl
from gateway.storage.flat import FlatVectors
from gateway.storage.flatfile import build_flat, open_flat
from gateway.storage.layout import DataLayout, ServedIndex, open_served
from gateway.storage.vectors import Snapshot
from tests.helpers.documents import RISK, STAFF, STAFF_EU, write_doc

META = {**STAFF_EU, "effective_from": "2020-01-01"}

pytestmark = pytest.mark.server


def _open(
    layout: DataLayout, embedder: Embedder, previous: ServedIndex | None = None
) -> ServedIndex:
    index = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim, previous)
    assert index is not None
    return index


def _one_document(tmp_path: Path, embedder: Embedder) -> tuple[DataLayout, Path]:
    """A data dir holding document `a` (generation 1), and the folder it came from."""
    docs = tmp_path / "docs"
    write_doc(docs, "a.md", {"doc_id": "a", **META}, "Rule AAA-1 applies.")
    layout = DataLayout(tmp_path / "data")
    ingest_paths([docs], layout, embedder)
    return layout, docs


def _same(a: FlatVectors, b: FlatVectors) -> None:
    assert a.rows.chunk_ids.equals(b.rows.chunk_ids)
    assert np.array_equal(np.asarray(a.matrix), np.asarray(b.matrix))
    for restriction in (STAFF, RISK):
        assert np.array_equal(a.permitted_rows(restriction), b.permitted_rows(restriction))


class CountingSnapshot:
    """A snapshot that counts the vectors read from the table."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot, self.vectors = snapshot, 0

    def _counted(self, batches: Iterable[pa.RecordBatch], columns: Sequence[str]):  # type: ignore[no-untyped-def]
        for batch in batches:
            if "vector" in columns:
                self.vectors += batch.num_rows
            yield batch

    def wrapped(self) -> Snapshot:
        read_from = self.snapshot.read_from
        assert read_from is not None
        return dataclasses.replace(
            self.snapshot,
            read=lambda columns: self._counted(self.snapshot.read(columns), columns),
            read_from=lambda at, columns: self._counted(read_from(at, columns), columns),
        )


def test_a_new_generation_reads_only_the_vectors_it_adds(
    tmp_path: Path, embedder: Embedder
) -> None:
    docs = tmp_path / "docs"
    for i in range(6):
        write_doc(docs, f"d{i}.md", {"doc_id": f"d{i}", **META}, f"Rule RUL-{i} applies.")
    layout = DataLayout(tmp_path / "data")
    ingest_paths([docs], layout, embedder)
    first = _open(layout, embedder)
    assert isinstance(first.flat.matrix, np.memmap)  # mapped from the data dir

    # One generation: a new document, an ACL revision (LanceDB rewrites those rows) and a
    # deletion.
    more = tmp_path / "more"
    write_doc(more, "new.md", {"doc_id": "new", **META}, "Rule NEW-9 applies.")
    ingest_paths([more], layout, embedder)
    set_acl(layout, "acme", "d1", ["group:risk"])
    delete_versions(layout, "acme", "d2")
    catalog = layout.open_catalog()
    generation = catalog.current_generation()
    assert generation is not None
    vectors = layout.open_vectors(
        generation.dim, version=generation.vector_version, table=generation.vector_table
    )
    counting = CountingSnapshot(vectors.snapshot())
    built = FlatVectors.build(counting.wrapped(), base=first.flat)
    assert counting.vectors == 2  # the new document's chunk and the revised one, no more
    _same(built, FlatVectors.build(vectors.snapshot()))  # as if read whole

    latest = _open(layout, embedder, first)
    _same(latest.flat, built)
    assert {latest.flat.chunk_id(r) for r in latest.flat.permitted_rows(RISK)} == {"d1@1:0"}
    assert "d2@1:0" not in {latest.flat.chunk_id(r) for r in range(latest.flat.size)}


def test_a_restart_maps_the_copy_and_never_a_half_written_one(
    tmp_path: Path, embedder: Embedder
) -> None:
    layout, docs = _one_document(tmp_path, embedder)
    first = _open(layout, embedder)
    copy = layout.flat_root / "g000001"
    assert (copy / "manifest.json").exists()

    # A builder that died mid-write leaves a partial directory and no manifest: rebuilt.
    (copy / "manifest.json").unlink()
    (copy / "matrix.npy").unlink()  # (the first open still maps the old file)
    (copy / "matrix.npy").write_bytes(b"torn")
    (layout.flat_root / "g000001.partial").mkdir()
    again = _open(layout, embedder)
    _same(again.flat, first.flat)
    assert not (layout.flat_root / "g000001.partial").exists()

    # A whole copy is mapped, not rebuilt: a changed matrix file shows through.
    matrix = np.load(copy / "matrix.npy", mmap_mode="r+")
    matrix[0] = 0.0
    matrix.flush()
    del matrix
    mapped = _open(layout, embedder)
    assert not np.asarray(mapped.flat.matrix[0]).any()

    # Copies of generations before the one before the newest are removed.
    for name in ("b", "c"):
        write_doc(docs, f"{name}.md", {"doc_id": name, **META}, f"Rule {name} applies.")
        ingest_paths([docs], layout, embedder)
        mapped = _open(layout, embedder, mapped)
    assert sorted(p.name for p in layout.flat_root.iterdir() if not p.name.startswith(".")) == [
        "g000002",
        "g000003",
    ]


def test_the_writer_builds_the_copy_so_a_server_answers_without_the_table(
    tmp_path: Path, embedder: Embedder
) -> None:
    layout, _ = _one_document(tmp_path, embedder)
    generation = layout.open_catalog().current_generation()
    assert generation is not None
    assert (layout.flat_root / "g000001" / "manifest.json").exists()  # before any server

    # With the table out of reach, a server still opens the generation and ranks by vector:
    # it maps the writer's copy instead of reading (or even opening) LanceDB.
    table = layout.vectors / f"{generation.vector_table}.lance"
    table.rename(table.with_name("away"))
    index = _open(layout, embedder)
    rows = index.flat.permitted_rows(STAFF)
    hits = index.flat.search(rows, embedder.embed_query("Which rule applies?"), 5)
    assert [h.chunk_id for h in hits] == ["a@1:0"]


def test_a_copied_data_dir_maps_the_copy_it_holds(tmp_path: Path, embedder: Embedder) -> None:
    layout, _ = _one_document(tmp_path, embedder)
    moved = DataLayout(Path(shutil.copytree(layout.root, tmp_path / "restored")))
    generation = moved.open_catalog().current_generation()
    assert generation is not None
    manifest = moved.flat_root / "g000001" / "manifest.json"
    written = manifest.stat().st_mtime_ns
    # As above: with the table out of reach, only the copy can answer.
    table = moved.vectors / f"{generation.vector_table}.lance"
    table.rename(table.with_name("away"))
    index = _open(moved, embedder)
    hits = index.flat.search(index.flat.permitted_rows(STAFF), embedder.embed_query("rule"), 5)
    assert [h.chunk_id for h in hits] == ["a@1:0"]
    assert manifest.stat().st_mtime_ns == written  # mapped, not built again


def test_a_writer_replaces_a_copy_a_crashed_attempt_left_under_the_same_key(
    tmp_path: Path, embedder: Embedder
) -> None:
    # A table dropped and made again (an erasure's) starts its versions again, so a copy a
    # crashed attempt left for generation 2 can carry the very key of other rows.
    stores = []
    for name in ("crashed", "committed"):
        docs = tmp_path / name
        write_doc(docs, f"{name}.md", {"doc_id": name, **META}, f"Rule of the {name} one.")
        layout = DataLayout(tmp_path / f"data-{name}")
        ingest_paths([docs], layout, embedder)
        generation = layout.open_catalog().current_generation()
        assert generation is not None
        stores.append(layout.open_vectors(generation.dim, table=generation.vector_table))
    root, key = tmp_path / "flat", {"vectors": "same", "vector_table": "t", "vector_version": 2}

    build_flat(root, 2, key, stores[0].snapshot)
    build_flat(root, 2, key, stores[1].snapshot)
    served = open_flat(root, 2, key, stores[0].snapshot, None)  # whole: mapped, not rebuilt
    assert [served.chunk_id(r) for r in range(served.size)] == ["committed@1:0"]


def test_the_copy_keeps_a_mapped_half_precision_twin_and_one_written_without_gets_it(
    tmp_path: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Screening reads a twin mapped from the data dir (shared by the processes of a
    host), not one made in private memory; a copy written before twins existed gets one
    on its first load to serve, and it ranks exactly as float32 does."""
    from gateway.storage import flat as flat_module

    monkeypatch.setattr(flat_module, "SCREEN_FROM", 1)  # screen even this small table
    layout, _docs = _one_document(tmp_path, embedder)
    copy = layout.flat_root / "g000001"
    served = _open(layout, embedder).flat
    assert isinstance(served.half, np.memmap) and Path(served.half.filename) == copy / "half.npy"
    assert np.array_equal(served.half, np.asarray(served.matrix).astype(np.float16))

    (copy / "half.npy").unlink()  # as an earlier release wrote it
    again = _open(layout, embedder).flat
    assert isinstance(again.half, np.memmap) and (copy / "half.npy").exists()
    assert not (copy / "half.npy.partial").exists()
    assert np.array_equal(again.half, served.half)
    rows = again.permitted_rows(STAFF)
    query = embedder.embed_query("which rule applies")
    assert again._scores(rows, query)[1] > 0  # screened
    plain = FlatVectors(again.rows, again.matrix, screen=False)
    assert [h.chunk_id for h in again.search(rows, query, 5)] == [
        h.chunk_id for h in plain.search(rows, query, 5)
    ]

    # A twin that does not fit its matrix (torn by a crash) is made again, not left to
    # refuse every start.
    for broken in (
        lambda p: np.save(p, np.zeros((1, 3), np.float16)),
        lambda p: p.write_bytes(b"torn"),
    ):
        broken(copy / "half.npy")
        mended = _open(layout, embedder).flat
        assert isinstance(mended.half, np.memmap)
        assert np.array_equal(mended.half, served.half)
