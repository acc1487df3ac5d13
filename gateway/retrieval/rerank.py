"""The rerank stage. The default does nothing; a cross-encoder joins when one is configured."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.retrieval.search import SearchHit


class Reranker(Protocol):
    name: str

    def rerank(self, query: str, hits: Sequence[SearchHit]) -> list[SearchHit]: ...


class KeepOrder:
    """Null object: fused order stands."""

    name = "none"

    def rerank(self, query: str, hits: Sequence[SearchHit]) -> list[SearchHit]:
        return list(hits)
