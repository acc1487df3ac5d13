"""The dense lane: embed the query, then nearest neighbours inside the restriction.

The engine is chosen per query by the size of the caller's universe, so that recall@10
stays at least 0.95 (measured, README):

- up to `flat_search_max_rows` permitted chunks: exact search over the generation's
  in-memory copy (recall 1.0, about 1 ms per 2,000 rows, no fixed engine cost);
- more, and the table has an IVF-PQ index, and the universe is at least MIN_ANN_SHARE of
  the table: LanceDB's prefiltered ANN with `ann_nprobes` and `ann_refine_factor`
  (recall 0.98 at 1% and 10% selectivity with the defaults);
- otherwise LanceDB scoring every permitted row (exact).

Whichever engine, only permitted chunks are ever scored.
"""

from __future__ import annotations

from gateway.embedding import Embedder
from gateway.policy.model import Retrieval
from gateway.retrieval.lanes.base import LaneResult
from gateway.retrieval.universe import Restriction
from gateway.storage.generations import ServedIndex
from gateway.telemetry.stages import StageTime, timed_ns

# Prefiltered IVF loses recall as the permitted share shrinks; 1% is the smallest share
# measured at recall 0.98, so a smaller universe (in a table over 5M rows) is scanned.
MIN_ANN_SHARE = 0.01


class DenseLane:
    name = "dense"
    essential = True

    def __init__(self, embedder: Embedder, settings: Retrieval | None = None) -> None:
        self._embedder = embedder
        self._settings = settings or Retrieval()

    def run(
        self, index: ServedIndex, restriction: Restriction, query: str, limit: int, shown: int = 0
    ) -> LaneResult:
        if restriction.is_empty:  # nothing to rank: do not even spend the embedding
            return LaneResult([], [])
        start = timed_ns()
        vector = self._embedder.embed_query(query, scope=restriction.tenant)
        embedded = timed_ns()
        rows = index.flat.permitted_rows(restriction)
        settings = self._settings
        engine = choose_engine(rows.size, index.flat.size, index.vectors.has_ann_index, settings)
        if engine == "flat":
            hits = index.flat.search(rows, vector, limit)
        else:
            hits = index.vectors.search(
                restriction,
                vector,
                limit,
                settings.ann_nprobes,
                settings.ann_refine_factor,
                exact=engine == "lancedb_exact",
            )
        done = timed_ns()
        return LaneResult(
            [h.chunk_id for h in hits],
            [1.0 - h.distance for h in hits],  # cosine similarity
            {"embed_query": StageTime(start, embedded), "dense": StageTime(embedded, done)},
            {"engine": engine, "permitted": int(rows.size)},
        )


def choose_engine(permitted: int, table_rows: int, has_ann_index: bool, settings: Retrieval) -> str:
    """flat, lancedb_ann or lancedb_exact, by the rules in this module's docstring."""
    if permitted <= settings.flat_search_max_rows:
        return "flat"
    if has_ann_index and permitted >= MIN_ANN_SHARE * table_rows:
        return "lancedb_ann"
    return "lancedb_exact"
