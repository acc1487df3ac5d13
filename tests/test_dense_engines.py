"""The dense lane's engines (exact in memory, LanceDB exact, LanceDB ANN) and their choice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from gateway.embedding import Embedder
from gateway.policy.model import Retrieval
from gateway.restriction import Restriction
from gateway.retrieval.lanes.dense import DenseLane
from gateway.storage import flat as flat_module
from gateway.storage.flat import FlatVectors
from gateway.storage.layout import DataLayout, open_served
from gateway.storage.vectors import ADDRESS, Snapshot, VectorHit
from tests.helpers.documents import TODAY, ingest_ann_notes

QUERIES = ["refund receipt", "how frequently is telecommuting permitted", "gift cards", "MRX"]


def test_in_memory_exact_search_ranks_like_lancedb_exact_search(
    data_dir: Path, embedder: Embedder
) -> None:
    """The in-memory engine (our own filter compilation and scoring) against LanceDB's
    prefiltered exact search as the reference, for callers who see different universes."""
    layout = DataLayout(data_dir)
    index = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim)
    assert index is not None
    callers = [
        Restriction("acme", frozenset({"group:staff"}), frozenset({"EU"}), TODAY),
        Restriction(
            "acme", frozenset({"group:staff", "group:merchant-risk"}), frozenset({"EU"}), TODAY
        ),
        Restriction("acme", frozenset({"group:staff"}), frozenset({"US"}), TODAY),
    ]
    compared = 0
    for restriction in callers:
        rows = index.flat.permitted_rows(restriction)
        assert {index.flat.chunk_id(r) for r in rows} == index.vectors.filter_only(restriction)
        for query in QUERIES:
            vector = embedder.embed_query(query)
            flat = index.flat.search(rows, vector, 100)
            lance = index.vectors.search(restriction, vector, 100, exact=True)
            assert [h.chunk_id for h in flat] == [h.chunk_id for h in lance]
            assert [round(h.distance, 4) for h in flat] == [round(h.distance, 4) for h in lance]
            compared += len(flat)
    assert compared > 0


def test_the_in_memory_copy_is_the_same_from_any_batching(
    data_dir: Path, embedder: Embedder
) -> None:
    """Streamed in small batches, with vectors that are not unit length, the copy admits
    the same rows and ranks by cosine exactly as the unit-length copy read whole."""
    layout = DataLayout(data_dir)
    index = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim)
    assert index is not None
    snapshot = index.vectors.snapshot()
    table = pa.Table.from_batches(
        list(
            snapshot.read(
                [ADDRESS, "chunk_id", "tenant", "region", "acl"]
                + ["effective_from", "effective_to", "vector"]
            )
        )
    )
    scale = np.linspace(0.5, 3.0, table.num_rows, dtype=np.float32)[:, None]
    stretched = np.stack(table.column("vector").to_numpy(zero_copy_only=False)) * scale
    vector = pa.FixedSizeListArray.from_arrays(pa.array(stretched.ravel()), embedder.dim)
    table = table.set_column(table.schema.get_field_index("vector"), "vector", vector)
    small = FlatVectors.build(
        Snapshot(
            table.num_rows,
            embedder.dim,
            lambda columns: table.select(list(columns)).to_batches(max_chunksize=3),
        )
    )
    assert table.num_rows > 6 and small.principals == index.flat.principals
    for restriction in (
        Restriction("acme", frozenset({"group:staff"}), frozenset({"EU"}), TODAY),
        Restriction("acme", frozenset({"group:staff"}), frozenset({"US"}), TODAY),
    ):
        rows = small.permitted_rows(restriction)
        assert rows.size > 0
        assert np.array_equal(rows, index.flat.permitted_rows(restriction))
        query = embedder.embed_query(QUERIES[0])
        expected = index.flat.search(rows, query, 20)
        found = small.search(rows, query, 20)
        assert [h.chunk_id for h in found] == [h.chunk_id for h in expected]
        assert np.allclose([h.distance for h in found], [h.distance for h in expected], atol=1e-5)


def test_runs_and_gathered_rows_rank_alike(
    data_dir: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = DataLayout(data_dir)
    index = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim)
    assert index is not None
    rows = index.flat.permitted_rows(
        Restriction("acme", frozenset({"group:staff"}), frozenset({"EU"}), TODAY)
    )
    scattered = rows[::2]  # runs of one row: gathered
    assert scattered.size > 3
    vector = embedder.embed_query(QUERIES[1])
    gathered = index.flat.search(scattered, vector, 10)
    monkeypatch.setattr(flat_module, "MIN_RUN", 0)  # now each one-row run is scored in place
    in_place = index.flat.search(scattered, vector, 10)
    assert [h.chunk_id for h in in_place] == [h.chunk_id for h in gathered]
    assert np.allclose([h.distance for h in in_place], [h.distance for h in gathered], atol=1e-6)


def test_scores_are_reused_only_for_the_very_same_rows_and_vector(
    data_dir: Path, embedder: Embedder
) -> None:
    """A search by document asks the copy again, deeper, with the same rows and vector:
    those get the last scores; any other rows or vector are scored anew."""
    layout = DataLayout(data_dir)
    index = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim)
    assert index is not None
    flat = index.flat
    staff = flat.permitted_rows(
        Restriction("acme", frozenset({"group:staff"}), frozenset({"EU"}), TODAY)
    )
    us = flat.permitted_rows(
        Restriction("acme", frozenset({"group:staff"}), frozenset({"US"}), TODAY)
    )
    first, second = (embedder.embed_query(q) for q in QUERIES[:2])
    fresh = FlatVectors(flat.rows, flat.matrix)  # scores nothing but what it is asked

    def ids(hits: list[VectorHit]) -> list[str]:
        return [h.chunk_id for h in hits]

    assert ids(flat.search(staff, first, 3)) == ids(fresh.search(staff, first, 3))
    assert ids(flat.search(staff, first, 20)) == ids(fresh.search(staff, first, 20))  # deeper
    assert ids(flat.search(staff, second, 20)) == ids(fresh.search(staff, second, 20))
    assert ids(flat.search(us, second, 20)) == ids(fresh.search(us, second, 20))
    assert ids(flat.search(staff, first, 20)) == ids(fresh.search(staff, first, 20))


def test_large_universes_use_the_ann_index_small_shares_are_searched_exactly(
    tmp_path: Path, embedder: Embedder
) -> None:
    layout = ingest_ann_notes(tmp_path, embedder)
    index = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim)
    assert index is not None and index.vectors.has_ann_index

    everyone = Restriction(
        "acme", frozenset({"group:staff", "group:few"}), frozenset({"EU"}), TODAY
    )
    few = Restriction("acme", frozenset({"group:few"}), frozenset({"EU"}), TODAY)  # 2 of 300
    lane = DenseLane(embedder, Retrieval(flat_search_max_rows=0))
    exact = DenseLane(embedder, Retrieval())  # in memory, exact
    for query in ("refund rules", "warranty number 7"):
        ann = lane.run(index, everyone, query, 10)
        assert ann.details["engine"] == "lancedb_ann"
        # The probes cover every partition of this small table: the ANN ranking is exact.
        assert ann.chunk_ids == exact.run(index, everyone, query, 10).chunk_ids
        small = lane.run(index, few, query, 10)
        assert small.details["engine"] == "flat"  # under 1% of the table: exact in memory
        assert sorted(small.chunk_ids) == ["d0@1:0", "d1@1:0"]
