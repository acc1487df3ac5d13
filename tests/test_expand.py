"""The expand stage: retrieved chunks gain their neighbours in the same section."""

from __future__ import annotations

from pathlib import Path

from gateway.embedding import Embedder
from gateway.ingest.chunk import ChunkingOptions
from gateway.ingest.pipeline import ingest_paths
from gateway.retrieval.expand import AsRetrieved, SectionNeighbours
from gateway.retrieval.results import SearchHit
from gateway.storage.layout import DataLayout
from tests.helpers.documents import STAFF_EU, write_doc

BODY = "# Returns\n\n" + " ".join(
    f"Returns rule number {n} says something specific." for n in range(24)
)
BODY += "\n\n# Shipping\n\nShipping takes three days. Parcels are tracked."
GENERATION = 1  # each test here ingests once: the hits come from generation 1


def hit(chunk_id: str, text: str = "x") -> SearchHit:
    doc_id, _, rest = chunk_id.partition("@")
    return SearchHit(chunk_id, doc_id, rest.split(":")[0], "t", "", 0.5, text, {"bm25": 1})


def test_neighbours_join_in_the_same_section_only(tmp_path: Path, embedder: Embedder) -> None:
    write_doc(
        tmp_path / "docs", "d.md", {"doc_id": "d", **STAFF_EU, "effective_from": "2020-01-01"}, BODY
    )
    layout = DataLayout(tmp_path / "data")
    ingest_paths(
        [tmp_path / "docs"], layout, embedder, ChunkingOptions(max_tokens=40, overlap_tokens=0)
    )
    catalog = layout.open_catalog()
    rows = catalog.chunks_of("acme", "d", "1")
    returns = [r.chunk_id for r in rows if r.parent == 0]
    shipping = [r.chunk_id for r in rows if r.parent == 1]
    assert len(returns) >= 4 and len(shipping) == 1

    expanded = SectionNeighbours(catalog, window=1).expand(
        [hit(returns[1]), hit(shipping[0])], "acme", GENERATION
    )
    assert [h.chunk_id for h in expanded] == [returns[1], returns[0], returns[2], shipping[0]]
    assert [h.expanded_from for h in expanded] == [None, returns[1], returns[1], None]
    assert expanded[1].text == rows[0].text and expanded[1].lanes == {"bm25": None}
    # Every block comes sized as ingest counted it, so assembly need not tokenize again.
    by_id = {r.chunk_id: r for r in rows}
    assert [h.tokens for h in expanded] == [by_id[h.chunk_id].token_count for h in expanded]
    assert all(h.tokens == embedder.count_tokens(by_id[h.chunk_id].text) for h in expanded)
    # The last chunk of a section does not reach into the next section.
    last = SectionNeighbours(catalog, window=1).expand([hit(returns[-1])], "acme", GENERATION)
    assert shipping[0] not in {h.chunk_id for h in last}
    # A neighbour that was retrieved itself keeps its own place; none is added twice.
    both = SectionNeighbours(catalog, window=1).expand(
        [hit(returns[1]), hit(returns[2])], "acme", GENERATION
    )
    assert [h.chunk_id for h in both] == [returns[1], returns[0], returns[2], returns[3]]
    assert AsRetrieved().expand([hit(returns[1])], "acme", GENERATION) == [hit(returns[1])]


def test_neighbours_and_vectors_come_from_the_requests_generation(
    tmp_path: Path, embedder: Embedder
) -> None:
    """A request pinned generation 1; the same version re-ingested since (generation 2, new
    text) must not lend it newer text, nor sentence vectors of the newer text."""
    meta = {"doc_id": "d", **STAFF_EU, "effective_from": "2020-01-01"}
    write_doc(tmp_path / "docs", "d.md", meta, BODY)
    layout = DataLayout(tmp_path / "data")
    options = ChunkingOptions(max_tokens=40, overlap_tokens=0)
    ingest_paths([tmp_path / "docs"], layout, embedder, options)
    catalog = layout.open_catalog()
    returns = [r.chunk_id for r in catalog.chunks_of("acme", "d", "1") if r.parent == 0]
    assert len(SectionNeighbours(catalog, window=1).expand([hit(returns[1])], "acme", 1)) == 3
    assert set(catalog.chunk_rows("acme", returns, as_of_generation=1)) == set(returns)

    write_doc(tmp_path / "docs", "d.md", meta, BODY.replace("specific", "REWRITTEN"))
    ingest_paths([tmp_path / "docs"], layout, embedder, options)
    pinned = SectionNeighbours(catalog, window=1).expand([hit(returns[1])], "acme", 1)
    assert [h.chunk_id for h in pinned] == [returns[1]]  # nothing of generation 2's text
    assert catalog.chunk_rows("acme", returns, as_of_generation=1) == {}
    current = SectionNeighbours(catalog, window=1).expand([hit(returns[1])], "acme", 2)
    assert len(current) == 3 and "REWRITTEN" in current[1].text
