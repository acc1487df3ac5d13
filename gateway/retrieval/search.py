"""Restricted hybrid search: restrict, run the lanes under budget, fuse, group, fetch."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

from gateway.domain import document_of, documents_of
from gateway.errors import GatewayError
from gateway.policy.model import Policy, Retrieval
from gateway.restriction import Restriction
from gateway.retrieval.budget import BudgetedPool, LaneOutcome
from gateway.retrieval.fuse import AGREEING_LANES, EXACT_LANE, FusedHit, Ranking, fusion
from gateway.retrieval.gate import TenantGate
from gateway.retrieval.lanes.base import Lane, LaneResult
from gateway.retrieval.scope import RequestScope
from gateway.telemetry.stages import StageClock, StageTime

GroupBy = Literal["chunk", "document"]
MAX_CANDIDATES = 1000
# Candidates per lane for each document shown. 4 (400 at top_k 100) lifted fused nDCG@10
# and Recall@100 by document on SciFact train (0.7163 -> 0.7179, 0.9528 -> 0.9578) and
# the SQuAD slice (0.9203 -> 0.9211), but cost 8.7 ms of p50 on the 200k bench.
DOCUMENT_DEPTH = 2
TRACED_IDS = 10  # IDs per stage span: enough to explain a ranking, small enough to ship


class SearchHit(NamedTuple):  # a tuple: up to 100 are made per request, each at tuple cost
    chunk_id: str
    doc_id: str
    version: str
    title: str
    uri: str
    score: float
    text: str
    lanes: dict[str, int | None]
    # Set on context the expand stage added: the retrieved chunk this one stands beside.
    expanded_from: str | None = None
    # Word pieces of `text` as counted at ingest, once the expand stage has read them.
    tokens: int | None = None

    @property
    def retrieved_as(self) -> str:
        """The retrieved chunk this hit is, or extends."""
        return self.expanded_from or self.chunk_id


@dataclass
class SearchOutcome:
    hits: list[SearchHit]
    degraded: list[str]
    generation: int


def today_utc() -> dt.date:
    return dt.datetime.now(dt.UTC).date()


class HybridSearcher:
    """Owns one bounded worker pool per lane for the lifetime of the app."""

    def __init__(self, lanes: Sequence[Lane], workers: int, max_abandoned: int) -> None:
        self.lanes = list(lanes)
        self._pools = {lane.name: BudgetedPool(lane.name, workers, max_abandoned) for lane in lanes}
        self.gate = TenantGate()

    @property
    def pools(self) -> list[BudgetedPool]:
        return list(self._pools.values())

    def close(self) -> None:
        for pool in self._pools.values():
            pool.shutdown()

    async def search(self, scope: RequestScope, group_by: GroupBy = "chunk") -> SearchOutcome:
        """Restricted, budgeted, fused search; every stage is recorded on the scope's clock."""
        index, policy, top_k, clock = scope.index, scope.policy, scope.top_k, scope.clock
        with clock.stage("restrict") as info:
            asked = Restriction.for_caller(scope.caller, scope.as_of or today_utc())
            restriction = asked.narrowed_to(index.acl_principals)
            info.update(
                principals=len(asked.principals),
                principals_in_use=len(restriction.principals),
                empty=restriction.is_empty,
                regions=sorted(restriction.regions),
                as_of=restriction.as_of.isoformat(),
            )
        outcome = SearchOutcome([], [], index.number)
        if restriction.is_empty:
            return outcome  # no principal, no universe: nothing is searched at all

        depth = policy.retrieval.candidates_per_lane
        per_shown = DOCUMENT_DEPTH if group_by == "document" else 1
        depth = min(MAX_CANDIDATES, max(depth, top_k * per_shown))
        tenant = scope.caller.tenant
        async with self.gate.admit(tenant, policy.limits.retrievals_per_tenant):
            results = await asyncio.gather(
                *(
                    self._pools[lane.name].run(
                        _bind(lane, scope, restriction, depth, group_by),
                        policy.budgets.lane_ms(lane.name) / 1000,
                        tenant,
                    )
                    for lane in self.lanes
                )
            )
        _record_lanes(clock, results, policy, depth)
        answered = _answered(results)
        outcome.degraded = [r.name for r in results if r.result is None]
        essential = {lane.name for lane in self.lanes if lane.essential}
        if not essential & answered.keys():
            raise GatewayError("lanes_unavailable", "no retrieval lane answered within its budget")

        settings = policy.retrieval
        names = [lane.name for lane in self.lanes]
        with clock.stage("fuse", mode=settings.fusion, k=settings.rrf_k, group_by=group_by) as info:
            rankings = {name: Ranking(r.chunk_ids, r.scores) for name, r in answered.items()}
            chunks = fusion(rankings, settings.fusion, settings.rrf_k, settings.weights)
            if group_by == "document":
                whole = {
                    name: Ranking(*r.documents)
                    for name, r in answered.items()
                    if r.documents is not None
                }
                fused = _fuse_documents(rankings, chunks.order, policy, names, top_k, whole)
            else:
                fused = chunks.hits(names, top_k)
            stored = {c: f for lane in answered.values() for c, f in lane.stored.items()}
            missing = [h.chunk_id for h in fused if h.chunk_id not in stored]
            stored.update(index.lexical.fetch(restriction, missing))
            outcome.hits = [
                SearchHit(
                    chunk_id=h.chunk_id,
                    doc_id=s.doc_id,
                    version=s.version,
                    title=s.title,
                    uri=s.uri,
                    score=h.score,
                    text=s.text,
                    lanes=h.ranks,
                )
                for h in fused
                if (s := stored.get(h.chunk_id)) is not None
            ]
            info.update(
                candidates=len(fused),
                fetched=len(missing),
                returned=len(outcome.hits),
                chunk_ids=[h.chunk_id for h in outcome.hits[:TRACED_IDS]],
                scores=[round(h.score, 6) for h in outcome.hits[:TRACED_IDS]],
            )
        return outcome


def _record_lanes(
    clock: StageClock, results: Sequence[LaneOutcome[LaneResult]], policy: Policy, depth: int
) -> None:
    """Lane stages as they ran in their threads; a degraded lane records why and its budget."""
    for outcome in results:
        budget = policy.budgets.lane_ms(outcome.name)
        if outcome.result is None:
            now = time.time_ns()
            clock.add(outcome.name, StageTime(now, now), degraded=outcome.reason, budget_ms=budget)
            continue
        for stage, when in outcome.result.stages.items():
            clock.add(stage, when)
        clock.attributes.setdefault(outcome.name, {}).update(
            **outcome.result.details,
            budget_ms=budget,
            depth=depth,
            hits=len(outcome.result.chunk_ids),
            chunk_ids=outcome.result.chunk_ids[:TRACED_IDS],
            scores=[round(x, 6) for x in outcome.result.scores[:TRACED_IDS]],
        )


def _bind(
    lane: Lane, scope: RequestScope, restriction: Restriction, depth: int, group_by: GroupBy
) -> Callable[[], LaneResult]:
    """The lane's call: `depth` chunks, or, when grouping by document, as many as it takes
    (up to MAX_CANDIDATES) to hold `top_k` distinct documents, so that documents with
    many matching chunks cannot crowd the others out of the lane's ranking."""
    index, query, top_k, settings = scope.index, scope.query, scope.top_k, scope.policy.retrieval
    documents = top_k if group_by == "document" else 0

    def run() -> LaneResult:
        result = lane.run(index, restriction, query, depth, top_k, settings)
        deeper = depth
        while (
            deeper < MAX_CANDIDATES
            and len(result.chunk_ids) >= deeper  # the lane had more to give
            and len({document_of(c) for c in result.chunk_ids}) < documents
        ):
            deeper = min(MAX_CANDIDATES, deeper * 2)
            again = lane.run(index, restriction, query, deeper, top_k, settings)
            first = result.stages
            stages = {
                name: StageTime(
                    first[name].start_ns if name in first else when.start_ns, when.end_ns
                )
                for name, when in again.stages.items()
            }
            result = replace(again, stages=stages, details={**again.details, "deepened_to": deeper})
        whole = getattr(lane, "rank_documents", None)  # a lane that can rank documents
        if documents and whole is not None:
            ranked = whole(index, restriction, query, depth, settings)
            if ranked is not None:
                ids, scores, when = ranked
                stages = {**result.stages, f"{lane.name}_documents": when}
                result = replace(result, stages=stages, documents=(ids, scores))
        return result

    return run


def _answered(results: Sequence[LaneOutcome[LaneResult]]) -> dict[str, LaneResult]:
    return {r.name: r.result for r in results if r.result is not None}


def _fuse_documents(
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
    by_document = {
        lane: rank_documents(ranking, document, settings, qualifying)
        for lane, ranking in rankings.items()
    }
    for lane, ranking in whole.items():
        # Two versions of a document can both be in force: it votes once, by its best.
        first: dict[str, float] = {}
        for chunk_id, score in zip(ranking.ids, ranking.scores, strict=True):
            first.setdefault(document_of(chunk_id), score)
        by_document[lane] = Ranking(list(first), list(first.values()))
        chunk_order = [*chunk_order, *ranking.ids]  # the first chunk shows what only it found
        document.update(documents_of(ranking.ids))
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
