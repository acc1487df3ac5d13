"""The expand stage: small retrieval units grow into the larger units the answer reads.

The default passes chunks through (chunks are already sentence-aligned windows); sentence
windows and parent sections arrive with the index lifecycle work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.retrieval.search import SearchHit


class Expander(Protocol):
    name: str

    def expand(self, hits: Sequence[SearchHit]) -> list[SearchHit]: ...


class AsRetrieved:
    """Null object: the retrieved chunk is the evidence."""

    name = "none"

    def expand(self, hits: Sequence[SearchHit]) -> list[SearchHit]:
        return list(hits)
