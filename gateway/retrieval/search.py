"""Restricted hybrid search: restrict, run every lane under its budget, then fuse and fetch
(`results.py`)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable, Sequence
from concurrent.futures import wait
from dataclasses import dataclass, replace

from gateway.domain import document_of
from gateway.errors import GatewayError
from gateway.placement import Placement
from gateway.policy.model import Policy
from gateway.restriction import Restriction
from gateway.retrieval.budget import BudgetedPool, LaneOutcome, log_failure
from gateway.retrieval.gate import TenantGate
from gateway.retrieval.lanes.base import DocumentRanking, Lane, LaneResult
from gateway.retrieval.results import TRACED_IDS, GroupBy, SearchHit, fuse_and_fetch
from gateway.retrieval.scope import RequestScope
from gateway.telemetry.stages import StageClock, StageTime

MAX_CANDIDATES = 1000
# Candidates per lane for each document shown. 4 (400 at top_k 100) lifted fused nDCG@10
# and Recall@100 by document on SciFact train (0.7163 -> 0.7179, 0.9528 -> 0.9578) and
# the SQuAD slice (0.9203 -> 0.9211), but cost 8.7 ms of p50 on the 200k bench.
DOCUMENT_DEPTH = 2


@dataclass
class SearchOutcome:
    hits: list[SearchHit]
    degraded: list[str]
    generation: int


def today_utc() -> dt.date:
    return dt.datetime.now(dt.UTC).date()


class HybridSearcher:
    """Owns one bounded worker pool per lane for the lifetime of the app."""

    def __init__(
        self,
        lanes: Sequence[Lane],
        workers: int,
        max_abandoned: int,
        placement: Placement | None = None,
    ) -> None:
        self.lanes = list(lanes)
        # Woken in this order. A worker woken first runs first: on two CPUs, with the dense
        # lane woken second, its query embedding began 0.84 ms after the search did (p50;
        # 3.2 ms at p95), and 0.55 ms (2.4) woken first: SciFact by document, top_k 100.
        self._wake_order = sorted(self.lanes, key=lambda lane: not lane.starts_first)
        cpus = (placement or Placement()).for_lane
        self._pools = {
            lane.name: BudgetedPool(
                lane.name, workers, max_abandoned, cpus(lane.name), beside=lane.documents_apart
            )
            for lane in lanes
        }
        self.gate = TenantGate()

    @property
    def pools(self) -> list[BudgetedPool]:
        return list(self._pools.values())

    def close(self) -> None:
        for pool in self._pools.values():
            pool.shutdown()

    async def search(self, scope: RequestScope, group_by: GroupBy = "chunk") -> SearchOutcome:
        """Restricted, budgeted, fused search; every stage is recorded on the scope's clock."""
        restriction = _restrict(scope)
        outcome = SearchOutcome([], [], scope.index.number)
        if restriction.is_empty:
            return outcome  # the caller holds no principal: nothing is searched at all
        depth = _depth(scope, group_by)
        results = await self._run_lanes(scope, restriction, depth, group_by)
        _record_lanes(scope.clock, results, scope.policy, depth)
        outcome.degraded = [r.name for r in results if r.result is None]
        answered = self._answered(results)
        names = [lane.name for lane in self.lanes]
        outcome.hits = fuse_and_fetch(scope, restriction, answered, names, group_by)
        return outcome

    async def _run_lanes(
        self, scope: RequestScope, restriction: Restriction, depth: int, group_by: GroupBy
    ) -> list[LaneOutcome[LaneResult]]:
        """Every lane at once, each in its own pool under its budget, once the tenant's
        turn to retrieve has come."""
        policy, tenant = scope.policy, scope.caller.tenant
        async with self.gate.admit(tenant, policy.limits.retrievals_per_tenant):
            outcomes = await asyncio.gather(
                *(
                    self._pools[lane.name].run(
                        _bind(lane, self._pools[lane.name], scope, restriction, depth, group_by),
                        policy.budgets.lane_ms(lane.name) / 1000,
                        tenant,
                    )
                    if (known := _at_once(lane, scope)) is None
                    else _answered_at_once(lane.name, known)
                    for lane in self._wake_order
                )
            )
        by_lane = {outcome.name: outcome for outcome in outcomes}
        return [by_lane[lane.name] for lane in self.lanes]

    def _answered(self, results: Sequence[LaneOutcome[LaneResult]]) -> dict[str, LaneResult]:
        """The lanes' results that came back; without an essential one the request fails."""
        answered = {r.name: r.result for r in results if r.result is not None}
        essential = {lane.name for lane in self.lanes if lane.essential}
        if not essential & answered.keys():
            raise GatewayError("lanes_unavailable", "no retrieval lane answered within its budget")
        return answered


def _at_once(lane: Lane, scope: RequestScope) -> LaneResult | None:
    """The lane's answer given on the spot, if it has one. One that fails there is run in
    its pool instead, where a failure degrades that lane alone, as any lane's does: it
    must not fail the whole request."""
    try:
        return lane.at_once(scope.index, scope.query)
    except Exception as exc:
        log_failure(f"lane {lane.name} failed to answer at once; its worker runs it", exc)
        return None


async def _answered_at_once(name: str, result: LaneResult) -> LaneOutcome[LaneResult]:
    return LaneOutcome(name, result, None)


def _restrict(scope: RequestScope) -> Restriction:
    """The caller's restriction, narrowed to the principals some ACL of the generation
    names; the `restrict` stage. Narrowed to nothing, it stays the caller's own: the ACLs
    naming a principal may belong to versions the caller may not see (not yet in force,
    another region or tenant), so the search must run its usual stages, at their usual
    cost, and find nothing in the engines, never stop early and so tell them apart."""
    with scope.clock.stage("restrict") as info:
        asked = Restriction.for_caller(scope.caller, scope.as_of or today_utc())
        narrowed = asked.narrowed_to(scope.index.acl_principals)
        restriction = asked if narrowed.is_empty else narrowed
        info.update(
            principals=len(asked.principals),
            principals_in_use=len(narrowed.principals),
            empty=narrowed.is_empty,
            regions=sorted(restriction.regions),
            as_of=restriction.as_of.isoformat(),
        )
    return restriction


def _depth(scope: RequestScope, group_by: GroupBy) -> int:
    """Chunks each lane ranks: the policy's `candidates_per_lane`, but enough for every
    result shown (DOCUMENT_DEPTH per document), and at most MAX_CANDIDATES."""
    per_shown = DOCUMENT_DEPTH if group_by == "document" else 1
    depth = max(scope.policy.retrieval.candidates_per_lane, scope.top_k * per_shown)
    return min(MAX_CANDIDATES, depth)


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
    lane: Lane,
    pool: BudgetedPool,
    scope: RequestScope,
    restriction: Restriction,
    depth: int,
    group_by: GroupBy,
) -> Callable[[], LaneResult]:
    """The lane's call: `depth` chunks, or, when grouping by document, as many as it takes
    (up to MAX_CANDIDATES) to hold `top_k` distinct documents, so that documents with
    many matching chunks cannot crowd the others out of the lane's ranking; and then the
    lane's own ranking of whole documents, if it has one."""
    index, query, settings = scope.index, scope.query, scope.policy.retrieval
    documents = scope.top_k if group_by == "document" else 0

    def rank_documents() -> DocumentRanking | None:
        return lane.rank_documents(index, restriction, query, depth, settings)

    def run() -> LaneResult:
        # A ranking of documents that shares no work with the chunks' runs beside them, on
        # a worker of the lane's own, instead of after them: by document on two cores,
        # what it adds is about half the CPU it adds (docs/evaluation.md, "Where the hot
        # path's time goes").
        beside = None
        if documents and lane.documents_apart:
            beside = pool.start_beside(scope.caller.tenant, rank_documents)
        try:
            result = _ranked_chunks(lane, scope, restriction, depth, documents)
        finally:
            if beside is not None:
                wait([beside])  # never left running past the call that started it
        if documents:
            if beside is not None and beside.cancelled():  # the pool is shutting down
                raise RuntimeError(f"lane {lane.name}'s ranking of documents was cancelled")
            ranked = beside.result() if beside is not None else rank_documents()
            if ranked is not None:
                ids, scores, when = ranked
                stages = {**result.stages, f"{lane.name}_documents": when}
                result = replace(result, stages=stages, documents=(ids, scores))
        return result

    return run


def _ranked_chunks(
    lane: Lane, scope: RequestScope, restriction: Restriction, depth: int, documents: int
) -> LaneResult:
    """The lane's chunks: `depth`, or deeper until they hold `documents` distinct ones."""
    index, query, top_k, settings = scope.index, scope.query, scope.top_k, scope.policy.retrieval
    # By document the lane is asked for twice the depth at once: its first `depth`
    # chunks are what it ranks at `depth`, and a search with a large `top_k` often
    # needs the next `depth` too (half of SciFact's claims at `top_k` 100), which then
    # costs no second search and no second reading of stored fields.
    asked = min(MAX_CANDIDATES, depth * 2) if documents else depth
    result = lane.run(index, restriction, query, asked, top_k, settings)
    deeper = depth
    while (
        deeper < MAX_CANDIDATES
        and len(result.chunk_ids) >= deeper  # the lane had more to give
        and len({document_of(c) for c in result.chunk_ids[:deeper]}) < documents
    ):
        deeper = min(MAX_CANDIDATES, deeper * 2)
        if deeper <= asked:
            continue
        asked = deeper
        again = lane.run(index, restriction, query, deeper, top_k, settings)
        first = result.stages
        stages = {
            name: StageTime(first[name].start_ns if name in first else when.start_ns, when.end_ns)
            for name, when in again.stages.items()
        }
        result = replace(again, stages=stages)
    result = replace(result, chunk_ids=result.chunk_ids[:deeper], scores=result.scores[:deeper])
    if deeper > depth:
        result = replace(result, details={**result.details, "deepened_to": deeper})
    return result
