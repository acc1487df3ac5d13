"""Whole documents for document-level BM25: a document version's chunks joined back into the
text the document reads, without the sentences the chunker repeats between chunks."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace

from gateway.domain import Chunk, version_key

# How far back in a chunk its successor's repeated sentences may start: the overlap is at
# most 112 word pieces (the policy's bound), a few hundred characters.
OVERLAP_REACH = 2000


def whole_documents(chunks: Iterable[Chunk]) -> list[Chunk]:
    """One entry per document version: its chunks' texts in order, each chunk's leading
    overlap with the one before dropped (the chunker repeats whole trailing sentences), so
    a term counts as often as the document says it. Named by the first chunk's ID."""
    versions: dict[str, list[Chunk]] = defaultdict(list)
    for chunk in chunks:
        versions[version_key(chunk.visibility.tenant, chunk.doc_id, chunk.version)].append(chunk)
    documents = []
    for parts in versions.values():
        parts.sort(key=lambda c: c.ordinal)
        texts = [parts[0].text]
        for before, chunk in itertools.pairwise(parts):
            texts.append(_without_overlap(before.text, chunk.text))
        whole = " ".join(t for t in texts if t)
        documents.append(replace(parts[0], text=whole, token_count=0))
    return documents


def _without_overlap(before: str, text: str, reach: int = OVERLAP_REACH) -> str:
    """`text` less its longest prefix that is whole sentences ending `before` (how the
    chunker repeats them); `text` itself when there is none."""
    start = max(0, len(before) - reach)
    for at in range(start, len(before)):
        if at and before[at - 2 : at] not in (". ", "! ", "? "):
            continue  # the repeated part starts a sentence of `before`
        repeated = len(before) - at
        if text.startswith(before[at:]) and text[repeated : repeated + 1] in ("", " "):
            return text[repeated:].lstrip()
    return text
