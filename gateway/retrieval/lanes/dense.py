"""The dense lane: embed the query, then LanceDB vector search prefiltered by the restriction."""

from __future__ import annotations

from gateway.embedding import Embedder
from gateway.retrieval.lanes.base import LaneResult
from gateway.retrieval.universe import Restriction
from gateway.storage.generations import ServedIndex
from gateway.telemetry.stages import StageTime, timed_ns


class DenseLane:
    name = "dense"
    essential = True

    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder

    def run(
        self, index: ServedIndex, restriction: Restriction, query: str, limit: int
    ) -> LaneResult:
        if restriction.is_empty:  # nothing to rank: do not even spend the embedding
            return LaneResult([], [])
        start = timed_ns()
        vector = self._embedder.embed_query(query, scope=restriction.tenant)
        embedded = timed_ns()
        hits = index.vectors.search(restriction, vector, limit)
        done = timed_ns()
        return LaneResult(
            [h.chunk_id for h in hits],
            [1.0 - h.distance for h in hits],  # cosine similarity
            {"embed_query": StageTime(start, embedded), "dense": StageTime(embedded, done)},
        )
