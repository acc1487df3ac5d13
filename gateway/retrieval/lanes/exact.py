"""The identifier lane: chunks that contain, verbatim, an identifier the query names.

Dense embeddings do not know that RPL-14 and RPL-41 are different rules, and RRF of BM25
with a dense lane that misses them can push the one chunk holding the code out of the top
results. This lane votes in the fusion only for exact identifier matches, so a document
quoting the code a user typed ranks first. It is empty when the query names no identifier.
"""

from __future__ import annotations

from gateway.policy.model import Retrieval
from gateway.restriction import Restriction
from gateway.retrieval.lanes.base import DocumentRanking, LaneResult
from gateway.storage.layout import ServedIndex
from gateway.telemetry.stages import StageTime, timed_ns


class ExactLane:
    name = "exact"
    essential = False
    documents_apart = False
    starts_first = False

    def at_once(self, index: ServedIndex, query: str) -> LaneResult | None:
        """Nothing, at once, for a query that names no identifier: most queries. Woken for
        those too, its worker was a third thread to wake on two cores for nothing (and a
        search waits for every lane: 5 of 380 bench searches waited on it, 0.3 ms each)."""
        if index.lexical.identifiers(query):
            return None
        now = timed_ns()
        return LaneResult([], [], {"exact": StageTime(now, now)})

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
        hits = index.lexical.search_identifiers(restriction, query, limit)
        when = StageTime(start, timed_ns())
        return LaneResult([h.chunk_id for h in hits], [h.score for h in hits], {"exact": when})

    def rank_documents(
        self,
        index: ServedIndex,
        restriction: Restriction,
        query: str,
        limit: int,
        settings: Retrieval,
    ) -> DocumentRanking | None:
        """None: an identifier is matched in a chunk, so this lane votes for a document
        through the chunks that quote it."""
        return None
