"""The dense lane: embed the query, then nearest neighbours inside the restriction.

The engine is chosen per query by the size of the caller's universe: up to
`flat_search_max_rows` permitted chunks, an exact search over the generation's in-memory
copy (recall 1.0, no fixed engine cost); beyond that, LanceDB with the restriction as its
prefilter, using its ANN index when the table has one. Either way only permitted chunks
are ever scored.
"""

from __future__ import annotations

from gateway.embedding import Embedder
from gateway.retrieval.lanes.base import LaneResult
from gateway.retrieval.universe import Restriction
from gateway.storage.generations import ServedIndex
from gateway.telemetry.stages import StageTime, timed_ns


class DenseLane:
    name = "dense"
    essential = True

    def __init__(self, embedder: Embedder, flat_max_rows: int = 50_000) -> None:
        self._embedder = embedder
        self._flat_max_rows = flat_max_rows

    def run(
        self, index: ServedIndex, restriction: Restriction, query: str, limit: int, shown: int = 0
    ) -> LaneResult:
        if restriction.is_empty:  # nothing to rank: do not even spend the embedding
            return LaneResult([], [])
        start = timed_ns()
        vector = self._embedder.embed_query(query, scope=restriction.tenant)
        embedded = timed_ns()
        rows = index.flat.permitted_rows(restriction)
        if rows.size <= self._flat_max_rows:
            engine, hits = "flat", index.flat.search(rows, vector, limit)
        else:
            engine, hits = "lancedb", index.vectors.search(restriction, vector, limit)
        done = timed_ns()
        return LaneResult(
            [h.chunk_id for h in hits],
            [1.0 - h.distance for h in hits],  # cosine similarity
            {"embed_query": StageTime(start, embedded), "dense": StageTime(embedded, done)},
            {"engine": engine, "permitted": int(rows.size)},
        )
