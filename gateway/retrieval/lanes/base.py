"""What every lane is: a named, synchronous ranking over one served generation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gateway.policy.model import Retrieval
from gateway.restriction import Restriction
from gateway.storage.layout import ServedIndex
from gateway.storage.lexical import StoredChunk
from gateway.telemetry.stages import StageTime


@dataclass(frozen=True)
class LaneResult:
    chunk_ids: list[str]  # best first
    scores: list[float]
    stages: dict[str, StageTime] = field(default_factory=dict)  # stage name -> when it ran
    details: dict[str, object] = field(default_factory=dict)  # trace attributes: IDs, counts
    # What results show of some of the ranked chunks, read under the same restriction from
    # the same generation; the search fetches only the chunks no lane brought.
    stored: dict[str, StoredChunk] = field(default_factory=dict)
    # The lane's own ranking of whole documents (each named by its first chunk), when it
    # has one and the request groups by document: it then stands for the lane's vote
    # instead of a ranking derived from its chunks.
    documents: tuple[list[str], list[float]] | None = None


# A lane's ranking of whole documents: each named by its first chunk, best first, with
# the lane's scores, and when the ranking ran (its own stage, `<lane>_documents`).
DocumentRanking = tuple[list[str], list[float], StageTime]


class Lane(Protocol):
    name: str
    # Without any essential lane the request fails (503); a non-essential lane only adds
    # votes to what the essential ones found.
    essential: bool
    # True when its ranking of whole documents shares no work with its ranking of chunks
    # (BM25 searches an index of its own), so the search runs the two at once; False when
    # it reuses what `run` computed on its thread (the dense lane's scores) or has none.
    documents_apart: bool
    # True for the lane a search waits on longest (the dense lane: the query's embedding,
    # then the vector search): its worker is woken before the others'.
    starts_first: bool

    def at_once(self, index: ServedIndex, query: str) -> LaneResult | None:
        """The lane's result when the query alone decides it (the identifier lane, for a
        query that names no identifier: nothing), so the search answers it on the spot
        and wakes no worker; None when the lane must run."""
        ...

    def run(
        self,
        index: ServedIndex,
        restriction: Restriction,
        query: str,
        limit: int,
        shown: int,
        settings: Retrieval | None = None,
    ) -> LaneResult:
        """Rank at most `limit` chunks the restriction admits; runs in a worker thread.
        `shown` is how many results the request will show (a lane may bring their
        stored fields). `settings` are the request's policy's, so that a reload applies
        from the next request; a lane built with settings of its own uses those without."""
        ...

    def rank_documents(
        self,
        index: ServedIndex,
        restriction: Restriction,
        query: str,
        limit: int,
        settings: Retrieval,
    ) -> DocumentRanking | None:
        """At most `limit` whole documents the restriction admits, when the request groups
        by document; runs in the same worker thread after `run`, or beside it when the
        lane's `documents_apart`. None when the lane has no ranking of whole documents (or
        the settings switch it off): its vote is then derived from its chunks."""
        ...
