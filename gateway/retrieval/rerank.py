"""The rerank stage. The default keeps the fused order; a cross-encoder reorders the top
candidates when `GATEWAY_RERANK_MODEL` names a local sentence-transformers cross-encoder.

Only candidates already retrieved from the caller's universe are reranked: the stage
reorders evidence, it never adds any.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from gateway.retrieval.results import SearchHit

PairScorer = Callable[[Sequence[tuple[str, str]]], np.ndarray]


class Reranker(Protocol):
    name: str

    def rerank(
        self, query: str, hits: Sequence[SearchHit], candidates: int | None = None
    ) -> list[SearchHit]:
        """`candidates`: how many of the first hits to reorder, from the request's policy
        (a reload applies from the next request); the reranker's own number without."""
        ...


class KeepOrder:
    """Null object: fused order stands."""

    name = "none"

    def rerank(
        self, query: str, hits: Sequence[SearchHit], candidates: int | None = None
    ) -> list[SearchHit]:
        return list(hits)


class CrossEncoderReranker:
    """The first `candidates` hits in cross-encoder order (ties keep fused order), then
    the rest as fused."""

    name = "cross-encoder"

    def __init__(self, score: PairScorer, candidates: int) -> None:
        self._score = score
        self.candidates = candidates

    def rerank(
        self, query: str, hits: Sequence[SearchHit], candidates: int | None = None
    ) -> list[SearchHit]:
        count = self.candidates if candidates is None else candidates
        head = list(hits[:count])
        scores = self._score([(query, hit.text) for hit in head])
        order = np.argsort(-scores, kind="stable")
        return [head[i] for i in order] + list(hits[count:])
