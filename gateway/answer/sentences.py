"""The sentences of the evidence, each with a vector to rank it against the query.

Vectors come from the catalog, where ingest stored them from the chunk's own forward pass
(late chunking), so answering costs no model time beyond the query's embedding. A chunk
without stored vectors as the request's generation holds them (its version was re-ingested
or revised since), or whose vectors do not match the text being served, has its sentences
embedded here instead.

A chunk's Markdown heading is one of its sentences (the vectors count it), marked as such:
it names a topic without saying anything about it, so the answerer never quotes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gateway.answer.context import Evidence
from gateway.embedding import Embedder, unpack_vectors
from gateway.ingest.chunk import opens_with_heading, split_sentences


@dataclass(frozen=True)
class EvidenceSentence:
    n: int  # citation number of the block it comes from
    position: int  # order within that block
    text: str
    vector: np.ndarray
    heading: bool = False  # a Markdown heading line, never quoted


StoredVectors = Callable[[Sequence[str]], Mapping[str, bytes | None]]


def evidence_sentences(
    evidence: Sequence[Evidence], stored: StoredVectors, embedder: Embedder
) -> tuple[list[EvidenceSentence], int]:
    """Every sentence of the evidence in order, and how many blocks had to be embedded now."""
    blobs = stored([e.hit.chunk_id for e in evidence])
    out: list[EvidenceSentence] = []
    embedded_now = 0
    for block in evidence:
        texts = split_sentences(block.hit.text)
        if not texts:
            continue
        vectors = _stored(blobs.get(block.hit.chunk_id), len(texts), embedder.dim)
        if vectors is None:
            vectors = embedder.embed(texts)
            embedded_now += 1
        heading = opens_with_heading(block.hit.text)  # then its first sentence
        out.extend(
            EvidenceSentence(block.n, i, text, vectors[i], heading=heading and i == 0)
            for i, text in enumerate(texts)
        )
    return out, embedded_now


def _stored(blob: bytes | None, expected: int, dim: int) -> np.ndarray | None:
    if not blob:
        return None
    rows = unpack_vectors(blob, dim)
    return rows if len(rows) == expected else None
