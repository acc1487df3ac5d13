"""Grouping by document: each lane's ranking of documents, and their fusion, each document
shown by one of its chunks.

`rank_documents` derives a lane's ranking of documents from its ranking of chunks; a lane
with a ranking of whole documents of its own (`Lane.rank_documents`) votes with that one
instead (`fuse_documents`'s `whole`).
"""

from __future__ import annotations

from gateway.domain import documents_of
from gateway.policy.model import Policy, Retrieval
from gateway.retrieval.fuse import AGREEING_LANES, EXACT_LANE, FusedHit, Ranking, fusion


def fuse_documents(
    rankings: dict[str, Ranking],
    chunk_order: list[str],
    policy: Policy,
    names: list[str],
    limit: int | None = None,
    whole: dict[str, Ranking] | None = None,
) -> list[FusedHit]:
    """Fuse each lane's ranking of documents (`rank_documents`, or the lane's ranking of
    whole documents in `whole`), so a document found through different chunks by
    different lanes gets every lane's vote; each document is shown by its best chunk in
    the chunk-level fusion, or by its first chunk when only a whole-document ranking
    found it."""
    whole = whole or {}
    document = documents_of(c for ranking in rankings.values() for c in ranking.ids)
    settings = policy.retrieval
    qualifying = _agreed(rankings) if settings.document_ranking == "layered" else None
    voted: dict[str, Ranking] = {}  # the lanes that vote with whole documents
    for lane, ranking in whole.items():
        named = documents_of(ranking.ids)
        # Two versions of a document can both be in force: it votes once, by its best.
        first: dict[str, float] = {}
        for chunk_id, score in zip(ranking.ids, ranking.scores, strict=True):
            first.setdefault(named[chunk_id], score)
        voted[lane] = Ranking(list(first), list(first.values()))
        chunk_order = [*chunk_order, *ranking.ids]  # the first chunk shows what only it found
        document.update(named)
    # Each lane once, in the lanes' order: fusion sums a document's terms in this order.
    by_document = {
        lane: voted[lane]
        if lane in voted
        else rank_documents(rankings[lane], document, settings, qualifying)
        for lane in dict.fromkeys([*rankings, *whole])
    }
    fused = fusion(by_document, settings.document_fusion, settings.rrf_k, settings.weights)
    shown = fused.hits(names, limit)
    wanted = {d.chunk_id for d in shown}
    best_chunk = _first_chunk_of(chunk_order, document, wanted)
    if len(best_chunk) < len(wanted):
        # Layered fusion can keep a document two lanes found through different chunks
        # while dropping each of those chunks: show its best-ranked chunk in any lane.
        fallback = sorted(
            (rank, chunk_id)
            for ranking in rankings.values()
            for rank, chunk_id in enumerate(ranking.ids)
        )
        ordered = [*chunk_order, *(c for _rank, c in fallback)]
        best_chunk = _first_chunk_of(ordered, document, wanted)
    return [FusedHit(best_chunk[d.chunk_id], d.score, d.ranks) for d in shown]


def _agreed(rankings: dict[str, Ranking]) -> set[str] | None:
    """The chunks `layered` counts: those both lanes of AGREEING_LANES found, and those
    quoting an identifier of the query (the exact lane); None when a lane did not answer
    (then every chunk counts)."""
    if not all(lane in rankings for lane in AGREEING_LANES):
        return None
    bm25, dense = (set(rankings[lane].ids) for lane in AGREEING_LANES)
    return (bm25 & dense) | set(rankings[EXACT_LANE].ids if EXACT_LANE in rankings else ())


def rank_documents(
    ranking: Ranking,
    document: dict[str, str],
    settings: Retrieval,
    qualifying: set[str] | None = None,
) -> Ranking:
    """One lane's ranking of documents from its ranking of chunks (`document_ranking`):
    - `best_chunk`: a document ranks where its best chunk does, with that chunk's score;
    - `decayed_sum`: sum over its best `document_chunks` chunks of decay^i times the
      chunk's score min-max normalised over the lane (so a lane's scale does not matter);
    - `rrf_sum`: the same sum of the chunks' RRF terms 1 / (k + rank) in the lane;
    - `layered`: `rrf_sum` over the `qualifying` chunks only (both lanes found them), as
      the layered ranking of Vespa sums a document's chunks that pass the first phase.
    The sums favour a document that several passages match, as document-level scoring
    does; ties (a document no qualifying chunk of which was found scores 0) keep the
    order of the documents' best chunks."""
    documents = [document[c] for c in ranking.ids]
    order = list(dict.fromkeys(documents))
    mode = settings.document_ranking
    if mode == "best_chunk":
        # A document's score is its best (first) chunk's: reversed, the first one wins.
        best_score = dict(zip(reversed(documents), reversed(ranking.scores), strict=True))
        return Ranking(order, [best_score[d] for d in order])
    if mode == "decayed_sum":
        low, high = min(ranking.scores, default=0.0), max(ranking.scores, default=0.0)
        span = (high - low) or 1.0
        terms = [(s - low) / span for s in ranking.scores]
    else:
        terms = [1.0 / (settings.rrf_k + rank) for rank in range(1, len(documents) + 1)]
    total: dict[str, float] = dict.fromkeys(order, 0.0)
    counted: dict[str, int] = dict.fromkeys(order, 0)
    for chunk_id, doc_id, term in zip(ranking.ids, documents, terms, strict=True):
        seen = counted[doc_id]
        if seen < settings.document_chunks and (qualifying is None or chunk_id in qualifying):
            total[doc_id] += term * settings.document_decay**seen
            counted[doc_id] = seen + 1
    first = {doc_id: i for i, doc_id in enumerate(order)}
    ranked = sorted(order, key=lambda d: (-total[d], first[d]))
    return Ranking(ranked, [total[d] for d in ranked])


def _first_chunk_of(
    chunk_order: list[str], document: dict[str, str], wanted: set[str]
) -> dict[str, str]:
    """Each wanted document's first chunk in `chunk_order`; the scan stops once all are."""
    first: dict[str, str] = {}
    for chunk_id in chunk_order:
        doc_id = document[chunk_id]
        if doc_id in wanted and doc_id not in first:
            first[doc_id] = chunk_id
            if len(first) == len(wanted):
                break
    return first
