"""The dense lane: embed the query, then LanceDB vector search prefiltered by the restriction."""

from __future__ import annotations

import time

from gateway.embedding import Embedder
from gateway.retrieval.lanes.base import LaneResult
from gateway.retrieval.universe import Restriction
from gateway.storage.generations import ServedIndex


class DenseLane:
    name = "dense"
    essential = True

    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder

    def run(
        self, index: ServedIndex, restriction: Restriction, query: str, limit: int
    ) -> LaneResult:
        if restriction.is_empty:  # nothing to rank: do not even spend the embedding
            return LaneResult([], [], {"embed_query": 0.0, "dense": 0.0})
        started = time.perf_counter()
        vector = self._embedder.embed_query(query)
        embedded = time.perf_counter()
        hits = index.vectors.search(restriction, vector, limit)
        done = time.perf_counter()
        return LaneResult(
            [h.chunk_id for h in hits],
            [1.0 - h.distance for h in hits],  # cosine similarity
            {"embed_query": (embedded - started) * 1000, "dense": (done - embedded) * 1000},
        )
