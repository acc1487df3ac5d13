"""The dense lane: embed the query, then nearest neighbours inside the restriction.

The engine is chosen per query so that recall@10 stays at least 0.95 (measured by
scripts/measure_filtered_ann.py: docs/evaluation.md, "Dense engine recall under the
permission filter"):

- exact search over the generation's in-memory copy, scoring permitted rows only (recall
  1.0): for every universe up to `flat_search_max_rows` chunks, and for any universe the
  ANN index may not serve;
- LanceDB's prefiltered IVF-PQ search with `ann_nprobes` and `ann_refine_factor`: for a
  larger universe, when the table has the index and the universe is at least
  MIN_ANN_SHARE of the table.

LanceDB scoring every permitted row is never chosen: it was slower than the in-memory
copy at every size measured. Whichever engine, only permitted chunks are ever scored.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.embedding import Embedder
from gateway.policy.model import Retrieval
from gateway.restriction import Restriction
from gateway.retrieval.lanes.base import DocumentRanking, LaneResult
from gateway.storage.layout import ServedIndex
from gateway.telemetry.stages import StageTime, timed_ns

# Prefiltered IVF loses recall as the permitted share shrinks; 1% is the smallest share
# measured (recall 0.977), so a smaller universe is searched exactly in memory.
MIN_ANN_SHARE = 0.01


class DenseLane:
    name = "dense"
    essential = True
    documents_apart = False
    starts_first = True

    def __init__(self, embedder: Embedder, settings: Retrieval | None = None) -> None:
        self._embedder = embedder
        self._settings = settings or Retrieval()

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
        if restriction.is_empty:  # nothing to rank: do not even spend the embedding
            return LaneResult([], [])
        start = timed_ns()
        vector = self._embedder.embed_query(query, scope=restriction.asker)
        embedded = timed_ns()
        rows = index.flat.permitted_rows(restriction)
        settings = settings or self._settings
        engine = choose_engine(
            rows.size, index.flat.size, lambda: index.vectors.has_ann_index, settings
        )
        details: dict[str, object] = {"engine": engine, "permitted": int(rows.size)}
        if engine == "flat":
            ids, similarities = index.flat.ranked(rows, vector, limit)
        else:
            nprobes, refine = settings.ann_nprobes, settings.ann_refine_factor
            hits = index.vectors.search(restriction, vector, limit, nprobes, refine)
            details.update(nprobes=nprobes, refine_factor=refine)
            ids, similarities = [h.chunk_id for h in hits], [1.0 - h.distance for h in hits]
        done = timed_ns()
        return LaneResult(
            ids,
            similarities,
            {"embed_query": StageTime(start, embedded), "dense": StageTime(embedded, done)},
            details,
        )

    def rank_documents(
        self,
        index: ServedIndex,
        restriction: Restriction,
        query: str,
        limit: int,
        settings: Retrieval,
    ) -> DocumentRanking | None:
        """Whole documents by a vector of each (`retrieval.document_vector`), exactly,
        among the permitted rows only; None when off, or when the universe is too large
        for the in-memory copy (the lane then votes from its chunks)."""
        kind = settings.document_vector
        if kind == "off" or restriction.is_empty:
            return None
        start = timed_ns()
        rows = index.flat.permitted_rows(restriction)
        if rows.size > settings.flat_search_max_rows:
            return None
        vector = self._embedder.embed_query(query, scope=restriction.asker)  # cached by run
        ids, scores = index.flat.ranked_documents(rows, vector, limit, kind)
        return ids, scores, StageTime(start, timed_ns())


def choose_engine(
    permitted: int, table_rows: int, has_ann_index: Callable[[], bool], settings: Retrieval
) -> str:
    """`flat` or `lancedb_ann`, by the rules in this module's docstring. The table is asked
    about its ANN index only for a universe too large for the in-memory copy: a server
    answering from that copy never opens LanceDB."""
    large = permitted > settings.flat_search_max_rows
    if large and permitted >= MIN_ANN_SHARE * table_rows and has_ann_index():
        return "lancedb_ann"
    return "flat"
