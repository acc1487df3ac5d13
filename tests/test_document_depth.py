"""Grouping by document: a document with many matching chunks cannot crowd others out, and
a lane whose ranking of whole documents is a search of its own runs it beside its chunks'."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from pathlib import Path

import pytest

from gateway.domain import Caller, document_of
from gateway.embedding import Embedder
from gateway.ingest.chunk import ChunkingOptions
from gateway.ingest.pipeline import ingest_paths
from gateway.policy.model import Policy
from gateway.restriction import Restriction
from gateway.retrieval import search as search_module
from gateway.retrieval.lanes.bm25 import Bm25Lane
from gateway.retrieval.lanes.dense import DenseLane
from gateway.retrieval.lanes.exact import ExactLane
from gateway.retrieval.scope import RequestScope
from gateway.retrieval.search import HybridSearcher
from gateway.storage.layout import DataLayout, ServedIndex, open_served
from gateway.telemetry.stages import StageClock
from tests.helpers.documents import STAFF_EU, write_doc

CALLER = Caller("u", "acme", "EU", frozenset({"group:staff"}), frozenset({"EU"}))


def lighthouses(
    tmp_path: Path, embedder: Embedder, duties: int, notes: int
) -> tuple[DataLayout, ServedIndex]:
    """One long manual about lighthouses, cut into many small chunks that all match, and
    short notes that each mention a lighthouse once, among other things."""
    meta = {**STAFF_EU, "effective_from": "2020-01-01"}
    manual = " ".join(
        f"Lighthouse keeper duty {n}: trim the lighthouse lamp." for n in range(duties)
    )
    write_doc(tmp_path / "docs", "manual.md", {"doc_id": "manual", **meta}, manual)
    for n in range(notes):
        body = f"Note {n} about harbour fees, tides and one lighthouse lamp on the coast."
        write_doc(tmp_path / "docs", f"note{n}.md", {"doc_id": f"note{n}", **meta}, body)
    layout = DataLayout(tmp_path / "data")
    ingest_paths(
        [tmp_path / "docs"], layout, embedder, ChunkingOptions(max_tokens=32, overlap_tokens=0)
    )
    index = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim)
    assert index is not None
    return layout, index


def test_lanes_go_deeper_until_they_hold_top_k_documents(
    tmp_path: Path, embedder: Embedder
) -> None:
    layout, index = lighthouses(tmp_path, embedder, duties=40, notes=6)
    manual_chunks = len(layout.open_catalog().chunks_of("acme", "manual", "1"))
    policy = Policy.model_validate({"retrieval": {"candidates_per_lane": 1}})
    searcher = HybridSearcher([Bm25Lane(), DenseLane(embedder)], workers=1, max_abandoned=1)
    today = dt.date.today()

    async def search(group_by: str, clock: StageClock) -> list[str]:
        scope = RequestScope(index, policy, CALLER, "lighthouse lamp keeper", 5, clock, today)
        outcome = await searcher.search(scope, group_by)  # type: ignore[arg-type]
        return [h.doc_id for h in outcome.hits]

    try:
        # Chunks alone: the manual's chunks take all five places (the crowding itself).
        assert manual_chunks > 10
        assert asyncio.run(search("chunk", StageClock())) == ["manual"] * 5
        # By document, each lane keeps going until it holds five documents.
        clock = StageClock()
        documents = asyncio.run(search("document", clock))
        assert len(documents) == 5 and len(set(documents)) == 5 and documents[0] == "manual"
        assert clock.attributes["bm25"]["deepened_to"] > 10
    finally:
        searcher.close()


def test_asking_twice_the_depth_at_once_ranks_as_going_deeper_step_by_step(
    tmp_path: Path, embedder: Embedder
) -> None:
    """By document a lane is asked for twice the depth in one search; what it keeps is
    exactly what asking at the depth, then at twice it, and so on, would have kept."""
    _, index = lighthouses(tmp_path, embedder, duties=60, notes=8)
    today = dt.date.today()
    restriction = Restriction.for_caller(CALLER, today)
    query = "lighthouse lamp keeper"
    deepened = []
    for top_k in (1, 3, 6, 9):
        policy = Policy.model_validate({"retrieval": {"candidates_per_lane": 1}})
        scope = RequestScope(index, policy, CALLER, query, top_k, StageClock(), today)
        depth = search_module._depth(scope, "document")
        for lane in (Bm25Lane(), DenseLane(embedder)):
            found = search_module._ranked_chunks(lane, scope, restriction, depth, top_k)
            step = depth  # the ranking step by step, one search per depth
            ranked = lane.run(index, restriction, query, step, top_k, policy.retrieval)
            while (
                step < search_module.MAX_CANDIDATES
                and len(ranked.chunk_ids) >= step
                and len({document_of(c) for c in ranked.chunk_ids}) < top_k
            ):
                step = min(search_module.MAX_CANDIDATES, step * 2)
                ranked = lane.run(index, restriction, query, step, top_k, policy.retrieval)
            assert found.chunk_ids == ranked.chunk_ids, (lane.name, top_k)
            assert found.scores == pytest.approx(ranked.scores), (lane.name, top_k)
            deepened.append(found.details.get("deepened_to", depth) > depth)
    assert any(deepened) and not all(deepened)  # both kinds of search were compared


class MeetingBm25(Bm25Lane):
    """BM25 whose first chunk search and document ranking each wait for the other to have
    begun: both finish only when they run at the same time."""

    def __init__(self) -> None:
        self.both_running = threading.Barrier(2, timeout=5)
        self.searches = 0

    def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.searches += 1
        if self.searches == 1:  # a deeper search, if any, need not meet anyone
            self.both_running.wait()
        return super().run(*args, **kwargs)

    def rank_documents(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.both_running.wait()
        return super().rank_documents(*args, **kwargs)


class FailingBesideBm25(Bm25Lane):
    """BM25 whose chunk search fails at once while its document ranking is still running."""

    def __init__(self) -> None:
        self.ranking_begun = threading.Event()
        self.ranking_done = threading.Event()

    def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.ranking_begun.wait(5)
        raise RuntimeError("the chunk search failed")

    def rank_documents(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.ranking_begun.set()
        time.sleep(0.3)  # a worker's sleep, not the test's
        ranked = super().rank_documents(*args, **kwargs)
        self.ranking_done.set()
        return ranked


class HeldBesideBm25(Bm25Lane):
    """BM25 whose ranking of whole documents waits until the test lets it go."""

    def __init__(self) -> None:
        self.chunks_done = threading.Event()
        self.release = threading.Event()

    def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return super().run(*args, **kwargs)
        finally:
            self.chunks_done.set()

    def rank_documents(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.release.wait(10)
        return super().rank_documents(*args, **kwargs)


def search_by(
    lanes: list, index: ServedIndex, group_by: str, clock: StageClock, bm25_ms: float = 300
) -> list[str]:
    """The lanes that degraded; the dense lane has all the time it needs."""
    policy = Policy.model_validate({"budgets": {"bm25_ms": bm25_ms, "dense_ms": 8000}})
    searcher = HybridSearcher(lanes, workers=2, max_abandoned=1)
    scope = RequestScope(index, policy, CALLER, "lighthouse lamp", 3, clock, dt.date.today())
    try:
        outcome = asyncio.run(searcher.search(scope, group_by))  # type: ignore[arg-type]
    finally:
        searcher.close()
    return outcome.degraded


def test_bm25_ranks_whole_documents_beside_its_chunks(tmp_path: Path, embedder: Embedder) -> None:
    _, index = lighthouses(tmp_path, embedder, duties=10, notes=4)
    clock = StageClock()
    assert search_by([MeetingBm25(), DenseLane(embedder)], index, "document", clock, 8000) == []
    assert {"bm25", "bm25_documents"} <= clock.stages.keys()  # both ran, and met
    # By chunk nothing runs beside: the chunk search alone would wait for a partner.
    lane = MeetingBm25()
    assert search_by([lane, DenseLane(embedder)], index, "chunk", StageClock()) == ["bm25"]
    lane.both_running.abort()  # let the abandoned chunk search end


def test_a_lane_that_fails_waits_for_its_document_ranking(
    tmp_path: Path, embedder: Embedder
) -> None:
    """The lane's call, failed, still ends only after what it started beside it, so no
    ranking outlives the call it belongs to (and its tenant's count of late work)."""
    _, index = lighthouses(tmp_path, embedder, duties=10, notes=4)
    lane = FailingBesideBm25()
    clock = StageClock()
    assert search_by([lane, DenseLane(embedder)], index, "document", clock, 8000) == ["bm25"]
    assert lane.ranking_done.is_set()


def test_a_late_call_stays_counted_until_its_document_ranking_ends(
    tmp_path: Path, embedder: Embedder
) -> None:
    """Past its budget, a BM25 call whose chunks are done but whose ranking beside them is
    not still counts against its tenant's late work, until that ranking ends."""
    _, index = lighthouses(tmp_path, embedder, duties=10, notes=4)
    lane = HeldBesideBm25()
    policy = Policy.model_validate({"budgets": {"bm25_ms": 200, "dense_ms": 8000}})
    searcher = HybridSearcher([lane, DenseLane(embedder)], workers=2, max_abandoned=1)
    (pool,) = [p for p in searcher.pools if p.name == "bm25"]

    async def late_then_done() -> None:
        scope = RequestScope(index, policy, CALLER, "lighthouse", 3, StageClock(), dt.date.today())
        outcome = await searcher.search(scope, "document")
        assert outcome.degraded == ["bm25"]
        assert lane.chunks_done.is_set() and pool.abandoned_by(CALLER.tenant) == 1
        lane.release.set()
        for _ in range(500):
            if pool.abandoned_by(CALLER.tenant) == 0:
                break
            await asyncio.sleep(0.01)
        assert pool.abandoned_by(CALLER.tenant) == 0

    try:
        asyncio.run(late_then_done())
    finally:
        lane.release.set()
        searcher.close()


class HeldDense(DenseLane):
    """A dense lane whose call is held past its budget until the test lets it go."""

    def __init__(self, embedder: Embedder, release: threading.Event) -> None:
        super().__init__(embedder)
        self.release = release

    def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.release.wait(10)
        return super().run(*args, **kwargs)


class HeldExact(ExactLane):
    """An identifier lane that always runs (no answer on the spot), held as HeldDense is."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    def at_once(self, index, query):  # type: ignore[no-untyped-def]
        return None

    def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.release.wait(10)
        return super().run(*args, **kwargs)


def test_lanes_are_reported_in_their_order_whichever_is_woken_first(
    tmp_path: Path, embedder: Embedder
) -> None:
    """The dense lane's worker is woken first (`starts_first`), yet what a search reports
    of its lanes keeps their order: `degraded` lists them as the lanes are listed."""
    _, index = lighthouses(tmp_path, embedder, duties=4, notes=2)
    release = threading.Event()
    lanes = [HeldExact(release), Bm25Lane(), HeldDense(embedder, release)]
    assert [lane.name for lane in lanes if lane.starts_first] == ["dense"]
    budgets = {"bm25_ms": 8000, "dense_ms": 50, "exact_ms": 50}
    policy = Policy.model_validate({"budgets": budgets})
    searcher = HybridSearcher(lanes, workers=1, max_abandoned=2)
    scope = RequestScope(index, policy, CALLER, "lighthouse lamp", 3, StageClock(), dt.date.today())
    try:
        outcome = asyncio.run(searcher.search(scope))
    finally:
        release.set()
        searcher.close()
    assert outcome.degraded == ["exact", "dense"]
    assert outcome.hits  # BM25 answered
