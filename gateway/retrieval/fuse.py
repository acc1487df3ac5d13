"""Fusion of ranked lanes by ID (chunk ID, or document key when grouping by document).

Three modes, chosen by `retrieval.fusion` in the policy:

- `rrf` (default): score(c) = sum over lanes L ranking c of 1 / (k + rank_L(c)), ranks
  1-based, k = `retrieval.rrf_k` (60).
- `weighted`: each lane's scores min-max normalised to [0, 1] over its own candidates,
  score(c) = sum over lanes of weight_L * norm_L(c) (absent: 0), weights from
  `retrieval.weights`.
- `layered`: only candidates both essential lanes found (BM25 and dense), or that quote an
  identifier of the query (the exact lane), ordered by RRF. When that leaves nothing, or
  one of the two lanes did not answer, every candidate is kept in RRF order, so a query
  only one lane understands still has results.

IDs are opaque: fusion never sees text, so equal texts with different ACLs or versions
stay apart. Ties break by best single-lane rank, then ID, so the order is deterministic.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

FusionMode = Literal["rrf", "weighted", "layered"]
AGREEING_LANES = ("bm25", "dense")  # layered mode: what "both lanes" means
EXACT_LANE = "exact"
RECIPROCALS = 1024  # ranks whose RRF term is kept precomputed, per k


class FusedHit(NamedTuple):  # a tuple: made per shown candidate, each at tuple cost
    chunk_id: str  # or a document key, when documents are fused
    score: float
    ranks: dict[str, int | None]  # lane -> 1-based rank in that lane, None if absent


@dataclass(frozen=True)
class Ranking:
    ids: Sequence[str]  # best first
    scores: Sequence[float]  # the lane's own scores, same order


def _positions(rankings: Mapping[str, Ranking]) -> dict[str, dict[str, int]]:
    """lane -> {id: 1-based rank}, duplicates within a lane counted once."""
    return {
        lane: {item: rank for rank, item in enumerate(dict.fromkeys(ranking.ids), start=1)}
        for lane, ranking in rankings.items()
    }


@dataclass(frozen=True)
class Fusion:
    """Every candidate in fused order; hits are materialised only for what is shown."""

    order: list[str]
    scores: dict[str, float]
    positions: dict[str, dict[str, int]]  # lane -> {id: 1-based rank}

    def hits(self, lanes: Sequence[str], limit: int | None = None) -> list[FusedHit]:
        found = [self.positions.get(lane, {}) for lane in lanes]
        scores = self.scores
        return [
            FusedHit(item, scores[item], _ranks_of(item, lanes, found))
            for item in self.order[:limit]
        ]


def _ranks_of(
    item: str, lanes: Sequence[str], found: list[dict[str, int]]
) -> dict[str, int | None]:
    return dict(zip(lanes, [at.get(item) for at in found], strict=True))


def fusion(
    rankings: Mapping[str, Ranking],
    mode: FusionMode = "rrf",
    k: int = 60,
    weights: Mapping[str, float] | None = None,
) -> Fusion:
    # This runs on every request over a few hundred candidates per lane, on the event
    # loop: plain dict passes per lane, and the reciprocal of each rank looked up.
    positions = _positions(rankings)
    best: dict[str, int] = {}  # the best single-lane rank, the first tie-break
    for at in positions.values():
        for item, rank in at.items():
            if best.setdefault(item, rank) > rank:
                best[item] = rank
    if mode == "weighted":
        scores = _weighted(rankings, weights or {})
    else:
        depth = max((len(at) for at in positions.values()), default=0)
        reciprocal = _reciprocals(k, max(RECIPROCALS, depth))
        scores = dict.fromkeys(best, 0.0)
        for at in positions.values():
            for item, rank in at.items():
                scores[item] += reciprocal[rank]
        # A lane that did not answer (past its budget, failed) cannot agree: then every
        # candidate counts, as `documents._agreed` does, or only the exact lane's few
        # would be left of what the other lane found.
        if mode == "layered" and all(lane in positions for lane in AGREEING_LANES):
            exact = positions.get(EXACT_LANE, {})
            agreeing = [positions.get(lane, {}) for lane in AGREEING_LANES]
            agreed = {
                item: score
                for item, score in scores.items()
                if item in exact or all(item in at for at in agreeing)
            }
            scores = agreed or scores
    keyed = sorted([(-score, best[item], item) for item, score in scores.items()])
    return Fusion([item for _score, _best, item in keyed], scores, positions)


@functools.lru_cache(maxsize=8)
def _reciprocals(k: int, depth: int) -> list[float]:
    """[0, 1/(k+1), ..., 1/(k+depth)]: the RRF term of each 1-based rank."""
    return [0.0, *(1.0 / (k + rank) for rank in range(1, depth + 1))]


def reciprocal_rank_fusion(
    rankings: Mapping[str, Sequence[str]], k: int = 60, lanes: Sequence[str] = ()
) -> list[FusedHit]:
    """RRF over plain ID lists; `lanes` names every lane that ran (absent ones report None)."""
    return fuse({lane: Ranking(ids, ()) for lane, ids in rankings.items()}, "rrf", k, lanes)


def fuse(
    rankings: Mapping[str, Ranking],
    mode: FusionMode = "rrf",
    k: int = 60,
    lanes: Sequence[str] = (),
    weights: Mapping[str, float] | None = None,
) -> list[FusedHit]:
    names = list(dict.fromkeys([*lanes, *rankings]))
    return fusion(rankings, mode, k, weights).hits(names)


def _weighted(rankings: Mapping[str, Ranking], weights: Mapping[str, float]) -> dict[str, float]:
    combined: dict[str, float] = {}
    for lane, ranking in rankings.items():
        weight = weights.get(lane, 1.0)
        scores = list(ranking.scores)
        if not scores or weight == 0:
            for item in ranking.ids:
                combined.setdefault(item, 0.0)
            continue
        low, high = min(scores), max(scores)
        span = high - low
        for item, score in zip(ranking.ids, scores, strict=True):
            normalised = (score - low) / span if span > 0 else 1.0
            combined[item] = combined.get(item, 0.0) + weight * normalised
    return combined
