"""The expand stage: small retrieval units grow into the larger units the answer reads.

Chunks are small so that retrieval is precise; an answer often needs the sentences next to
the one that matched. The neighbour expander places, right after each retrieved chunk,
the chunks within `window` positions of it in the same section (its parent), from the
same document version, so they have exactly its visibility. Each neighbour stays its own
evidence block with its own citation, so a quoted sentence always cites the chunk that
holds it. The null expander passes hits through.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.domain import split_chunk_id
from gateway.retrieval.results import SearchHit
from gateway.storage.catalog import Catalog, ChunkText


class Expander(Protocol):
    name: str

    def expand(self, hits: Sequence[SearchHit], tenant: str, generation: int) -> list[SearchHit]:
        """`hits` were retrieved from index generation `generation`, in `tenant` (the
        caller's); what is added comes from that tenant and generation too."""
        ...


class AsRetrieved:
    """Null object: the retrieved chunk is the evidence."""

    name = "none"

    def expand(self, hits: Sequence[SearchHit], tenant: str, generation: int) -> list[SearchHit]:
        return list(hits)


class SectionNeighbours:
    name = "neighbours"

    def __init__(self, catalog: Catalog, window: int) -> None:
        self._catalog = catalog
        self.window = window

    def expand(self, hits: Sequence[SearchHit], tenant: str, generation: int) -> list[SearchHit]:
        """Each hit, with its size as stored at ingest, followed by its new neighbours, as
        the hits' generation holds them (a version written or revised since brings none)."""
        retrieved = {h.chunk_id for h in hits}
        placed: set[str] = set()
        out: list[SearchHit] = []
        siblings_of = self._catalog.chunks_of_versions(
            tenant, ((h.doc_id, h.version) for h in hits), as_of_generation=generation
        )
        for hit in hits:
            siblings = siblings_of[(hit.doc_id, hit.version)]
            own, near = _near(siblings, hit.chunk_id, self.window)
            out.append(hit._replace(tokens=own.token_count) if own is not None else hit)
            for row in near:
                if row.chunk_id in retrieved or row.chunk_id in placed:
                    continue  # already evidence in its own right
                placed.add(row.chunk_id)
                out.append(_beside(hit, row))
        return out


def _near(
    rows: list[ChunkText], chunk_id: str, window: int
) -> tuple[ChunkText | None, list[ChunkText]]:
    """The chunk's own row and its neighbours within `window` in the same section."""
    ordinal = split_chunk_id(chunk_id)[2]
    own = next((r for r in rows if r.ordinal == ordinal), None)
    if own is None:
        return None, []
    return own, [
        r
        for r in rows
        if r.parent == own.parent and r.ordinal != ordinal and abs(r.ordinal - ordinal) <= window
    ]


def _beside(hit: SearchHit, row: ChunkText) -> SearchHit:
    return SearchHit(
        chunk_id=row.chunk_id,
        doc_id=hit.doc_id,
        version=hit.version,
        title=hit.title,
        uri=hit.uri,
        score=hit.score,
        text=row.text,
        lanes={lane: None for lane in hit.lanes},
        expanded_from=hit.chunk_id,
        tokens=row.token_count,
    )
