"""The lexical lane: Tantivy BM25 inside the restriction."""

from __future__ import annotations

from gateway.policy.model import Retrieval
from gateway.restriction import Restriction
from gateway.retrieval.lanes.base import DocumentRanking, LaneResult
from gateway.storage.layout import ServedIndex
from gateway.telemetry.stages import StageTime, timed_ns


class Bm25Lane:
    name = "bm25"
    essential = True
    documents_apart = True
    starts_first = False

    def at_once(self, index: ServedIndex, query: str) -> LaneResult | None:
        return None  # always reads the index

    def run(
        self,
        index: ServedIndex,
        restriction: Restriction,
        query: str,
        limit: int,
        shown: int = 0,
        settings: Retrieval | None = None,
    ) -> LaneResult:
        start = timed_ns()
        hits = index.lexical.search(restriction, query, limit, stored=shown)
        when = StageTime(start, timed_ns())
        return LaneResult(
            [h.chunk_id for h in hits],
            [h.score for h in hits],
            {"bm25": when},
            stored={h.chunk_id: h.stored for h in hits if h.stored is not None},
        )

    def rank_documents(
        self,
        index: ServedIndex,
        restriction: Restriction,
        query: str,
        limit: int,
        settings: Retrieval,
    ) -> DocumentRanking | None:
        """BM25 over whole documents (`retrieval.document_bm25`), in the same restricted
        universe; None when off, or for a generation indexed before documents were."""
        if not settings.document_bm25:
            return None
        start = timed_ns()
        hits = index.lexical.search_documents(restriction, query, limit)
        if hits is None:
            return None
        return [h.chunk_id for h in hits], [h.score for h in hits], StageTime(start, timed_ns())
