"""Half-precision screening in the in-memory dense engine: inside its proven bound, and
ranking chunks and documents exactly as float32 scoring does, inside the universe only."""

from __future__ import annotations

import datetime as dt
import itertools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest

from gateway.restriction import OPEN_END_DAY, Restriction
from gateway.storage import flat as flat_module
from gateway.storage.flat import FlatVectors, screen_error
from gateway.storage.vectors import ADDRESS, Snapshot

TODAY = dt.date(2026, 11, 26)
STAFF = Restriction("acme", frozenset({"group:staff"}), frozenset({"EU"}), TODAY)
BOTH = Restriction("acme", frozenset({"group:staff", "group:other"}), frozenset({"EU"}), TODAY)
DIM = 384
pytestmark = pytest.mark.model  # screening runs on torch


def _unit(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float32)
    unit: np.ndarray = rows / np.linalg.norm(rows, axis=-1, keepdims=True)
    return unit


def _hard_vectors(rng: np.random.Generator, count: int, dim: int) -> np.ndarray:
    """Families that stress half precision: all components alike (scores near 1), a few
    dominant components, components below half's normal range, near-duplicates and exact
    duplicates (near-ties everywhere), and plain random directions."""
    base = rng.standard_normal(dim)
    families = [
        rng.standard_normal((count, dim)),
        np.abs(rng.standard_normal((count, dim))),
        1.0 + 0.01 * rng.standard_normal((count, dim)),
        rng.standard_normal((count, dim)) * np.r_[np.full(4, 300.0), np.ones(dim - 4)],
        rng.standard_normal((count, dim)) * np.r_[np.ones(8), np.full(dim - 8, 1e-6)],
        base + 0.002 * rng.standard_normal((count, dim)),
        np.repeat(base[None, :], count, axis=0),
    ]
    return _unit(np.concatenate(families))


def _flat(
    vectors: np.ndarray, groups: Sequence[str], screen: bool, monkeypatch: pytest.MonkeyPatch
) -> FlatVectors:
    """A copy of these vectors, chunk i of document i // 3, its ACL groups[i]; screening
    every universe from one row on (for the rest of the test), or none."""
    count, dim = vectors.shape
    table = pa.table(
        {
            ADDRESS: pa.array(np.arange(count, dtype=np.uint64)),
            "chunk_id": [f"d{i // 3}@1:{i % 3}" for i in range(count)],
            "tenant": ["acme"] * count,
            "region": ["EU"] * count,
            "acl": [[g] for g in groups],
            "effective_from": pa.array([0] * count, pa.int32()),
            "effective_to": pa.array([OPEN_END_DAY] * count, pa.int32()),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), dim),
        }
    )

    def read(columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
        return iter(table.select(list(columns)).to_batches(max_chunksize=1000))

    if screen:
        monkeypatch.setattr(flat_module, "SCREEN_FROM", 1)
        return FlatVectors.build(Snapshot(count, dim, read))
    with monkeypatch.context() as patch:  # no half-precision copy: float32 scores all
        patch.setattr(flat_module, "SCREEN_FROM", count + 1)
        return FlatVectors.build(Snapshot(count, dim, read))


@pytest.mark.parametrize("dim", [DIM, 1024])
def test_screened_scores_stay_inside_the_proven_bound(
    dim: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(dim)
    vectors = _hard_vectors(rng, 300, dim)
    flat = _flat(vectors, ["group:staff"] * len(vectors), True, monkeypatch)
    rows = flat.permitted_rows(STAFF)
    exact = np.asarray(flat.matrix, dtype=np.float64)
    single = np.asarray(flat.matrix, dtype=np.float32)
    for query in [*_hard_vectors(rng, 2, dim), vectors[5], vectors[-1]]:
        scores, error = flat._scores(rows, query.copy())
        assert error == screen_error(dim) > 0  # screened, not scored in float32
        truth = exact[rows] @ query.astype(np.float64)
        assert np.abs(scores - truth).max() <= error
        unit = (query / np.linalg.norm(query)).astype(np.float32)
        assert np.abs(scores - single[rows] @ unit).max() <= error  # what it stands for


def test_screening_ranks_chunks_and_documents_exactly_as_float32(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Among thousands of near-ties, in runs of rows and in scattered rows, the screened
    copy returns the very chunks and documents, in the very order, that float32 does."""
    rng = np.random.default_rng(7)
    vectors = _hard_vectors(rng, 400, DIM)
    # Alternating blocks of two groups: a caller's rows form runs, both of them scattered.
    groups = [("group:staff", "group:other")[(i // 40) % 2] for i in range(len(vectors))]
    plain = _flat(vectors, groups, False, monkeypatch)
    screened = _flat(vectors, groups, True, monkeypatch)
    queries = [vectors[11] + 1e-4 * rng.standard_normal(DIM), *_hard_vectors(rng, 1, DIM)[::50]]
    for restriction in (STAFF, BOTH):
        rows = screened.permitted_rows(restriction)
        assert np.array_equal(rows, plain.permitted_rows(restriction))
        for asked in (rows, rows[::3]):  # runs scored in place; rows gathered
            for query in queries:
                for limit in (1, 10, 200, asked.size + 5):
                    got = screened.search(asked, query.copy(), limit)
                    want = plain.search(asked, query.copy(), limit)
                    assert [h.chunk_id for h in got] == [h.chunk_id for h in want]
                    assert np.allclose(
                        [h.distance for h in got], [h.distance for h in want], atol=1e-6
                    )
                for kind in ("mean", "first"):
                    for limit in (1, 10, 100):
                        got = screened.search_documents(asked, query.copy(), limit, kind)
                        want = plain.search_documents(asked, query.copy(), limit, kind)
                        assert [h.chunk_id for h in got] == [h.chunk_id for h in want]
                        assert np.allclose(
                            [h.distance for h in got], [h.distance for h in want], atol=1e-6
                        )


def test_screening_scores_no_row_outside_the_universe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows the caller may not see hold the query itself: screening them would rank them
    first. Nothing of theirs may come back, by chunk or by document."""
    rng = np.random.default_rng(3)
    count = 3000
    vectors = _unit(rng.standard_normal((count, DIM)))
    query = vectors[0].copy()
    hidden = (np.arange(count) // 3) % 7 == 0  # whole documents, as ACLs are
    vectors[hidden] = query
    groups = ["group:secret" if h else "group:staff" for h in hidden]
    flat = _flat(vectors, groups, True, monkeypatch)
    rows = flat.permitted_rows(STAFF)
    allowed = {flat.chunk_id(int(r)) for r in rows}
    assert rows.size == count - hidden.sum()
    found = flat.search(rows, query, 50)
    assert len(found) == 50 and {h.chunk_id for h in found} <= allowed
    assert min(h.distance for h in found) > 1e-3  # no copy of the query among them
    for kind in ("mean", "first"):
        documents = flat.search_documents(rows, query, 1000, kind)
        assert documents and {h.chunk_id for h in documents} <= allowed


def test_a_screen_runs_torch_on_its_thread_alone_and_gives_the_threads_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lane's screen runs on its own thread only (an OpenMP team would wait for a core
    the other lanes hold); afterwards that thread (torch embedding queries when ONNX is
    off) and every other (the worker's passages) have their threads again."""
    import torch

    rng = np.random.default_rng(5)
    vectors = _unit(rng.standard_normal((50, DIM)))
    flat = _flat(vectors, ["group:staff"] * len(vectors), True, monkeypatch)
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # as on a two-core server (the suite runs with one)
    during: list[int] = []
    after: list[int] = []
    real_mv = torch.mv

    def mv(*args: torch.Tensor) -> torch.Tensor:
        during.append(torch.get_num_threads())
        return real_mv(*args)

    monkeypatch.setattr(torch, "mv", mv)

    def lane() -> None:
        for _ in range(2):
            flat.search(flat.permitted_rows(STAFF), vectors[0].copy(), 3)
        after.append(torch.get_num_threads())

    try:
        for target in (lane, lambda: after.append(torch.get_num_threads())):
            worker = threading.Thread(target=target)
            worker.start()
            worker.join()
        assert during == [1, 1] and after == [2, 2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def _documents_of_both_groups(
    vectors: np.ndarray, screen: bool, monkeypatch: pytest.MonkeyPatch
) -> tuple[FlatVectors, np.ndarray]:
    """A copy whose documents (three chunks each) alternate between two groups, so its
    clustered order is not the table's, and the rows a caller of both groups may see."""
    groups = [("group:staff", "group:other")[(i // 3) % 2] for i in range(len(vectors))]
    flat = _flat(vectors, groups, screen, monkeypatch)
    return flat, flat.permitted_rows(BOTH)


@pytest.mark.parametrize("screen", [False, True])
def test_copies_of_one_document_rank_in_table_order_by_chunk_and_by_document(
    screen: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twelve documents with the very same chunks tie for every query. By document, as by
    chunk, they come in the table's own order (as LanceDB breaks ties): not by their IDs
    as strings (d10 before d2), nor with one ACL's documents before the other's (the
    copy's clustered order), so every caller who sees them sees them in one order."""
    rng = np.random.default_rng(5)
    text = _unit(rng.standard_normal(DIM))
    vectors = np.repeat(text[None, :], 36, axis=0)
    flat, rows = _documents_of_both_groups(vectors, screen, monkeypatch)
    in_table_order = [f"d{n}@1:0" for n in range(12)]
    for kind in ("mean", "first"):
        for limit in (12, 5):
            found = flat.search_documents(rows, text.copy(), limit, kind)
            assert [h.chunk_id for h in found] == in_table_order[:limit]
    chunks = flat.search(rows, text.copy(), 36)
    assert [h.chunk_id for h in chunks] == [f"d{i // 3}@1:{i % 3}" for i in range(36)]


@pytest.mark.parametrize("screen", [False, True])
def test_copies_a_rounding_step_apart_rank_in_table_order(
    screen: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Copies of one text whose scores differ by less than TIE, each later document a
    hair closer to the query (its score would put it first): by document, as by chunk,
    they still come in the table's order, whatever the limit."""
    rng = np.random.default_rng(9)
    text = _unit(rng.standard_normal(DIM))
    query = _unit(text + 0.5 * _unit(rng.standard_normal(DIM)))
    toward = query - (query @ text) * text  # what raises a copy's score, to first order
    documents = [_unit(text + n * 5e-8 * toward) for n in range(12)]
    vectors = np.repeat(np.array(documents), 3, axis=0)
    flat, rows = _documents_of_both_groups(vectors, screen, monkeypatch)
    for kind in ("mean", "first"):
        found = flat.search_documents(rows, query.copy(), 12, kind)
        assert len({h.distance for h in found}) > 1  # not all equal: near ties, not ties
        assert [h.chunk_id for h in found] == [f"d{n}@1:0" for n in range(12)]
        for limit in (1, 5):
            shorter = flat.search_documents(rows, query.copy(), limit, kind)
            assert [h.chunk_id for h in shorter] == [h.chunk_id for h in found][:limit]


@pytest.mark.parametrize("screen", [False, True])
def test_each_set_of_rows_is_ranked_by_document_from_its_own_documents(
    screen: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a caller's permitted rows hold by document is kept with them, made once: more
    callers than are kept, each seeing as many rows as the others but not the same ones,
    asked in turn and again, rank as their rows do in a copy that has kept nothing."""
    rng = np.random.default_rng(12)
    teams = [f"group:team-{n}" for n in range(12)]
    vectors = _hard_vectors(rng, 20, DIM)[: 3 * 3 * len(teams)]  # three documents a team
    acls = [teams[(i // 3) % len(teams)] for i in range(len(vectors))]
    flat = _flat(vectors, acls, screen, monkeypatch)
    unasked = _flat(vectors, acls, screen, monkeypatch)  # keeps nothing: never asked to permit
    pairs = list(itertools.combinations(teams, 2))
    assert len(pairs) > flat_module.PERMITTED_CACHE  # some are evicted and made again
    query = _hard_vectors(rng, 1, DIM)[0]
    for _ in range(2):
        for pair in pairs:
            rows = flat.permitted_rows(replace(STAFF, principals=frozenset(pair)))
            assert rows.size == 18
            for kind in ("mean", "first"):
                got = flat.search_documents(rows, query.copy(), 4, kind)
                want = unasked.search_documents(rows.copy(), query.copy(), 4, kind)
                assert [(h.chunk_id, h.distance) for h in got] == [
                    (h.chunk_id, h.distance) for h in want
                ]
