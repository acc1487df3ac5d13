"""The lexical lane: Tantivy BM25 inside the restriction."""

from __future__ import annotations

import time

from gateway.retrieval.lanes.base import LaneResult
from gateway.retrieval.universe import Restriction
from gateway.storage.generations import ServedIndex


class Bm25Lane:
    name = "bm25"
    essential = True

    def run(
        self, index: ServedIndex, restriction: Restriction, query: str, limit: int
    ) -> LaneResult:
        started = time.perf_counter()
        hits = index.lexical.search(restriction, query, limit)
        elapsed = (time.perf_counter() - started) * 1000
        return LaneResult([h.chunk_id for h in hits], [h.score for h in hits], {"bm25": elapsed})
