"""Fusion of ranked lanes by ID (chunk ID, or document key when grouping by document).

Three modes, chosen by `retrieval.fusion` in the policy:

- `rrf` (default): score(c) = sum over lanes L ranking c of 1 / (k + rank_L(c)), ranks
  1-based, k = `retrieval.rrf_k` (60).
- `weighted`: each lane's scores min-max normalised to [0, 1] over its own candidates,
  score(c) = sum over lanes of weight_L * norm_L(c) (absent: 0), weights from
  `retrieval.weights`.
- `layered`: only candidates both essential lanes found (BM25 and dense), or that quote an
  identifier of the query (the exact lane), ordered by RRF. When that leaves nothing, every
  candidate is kept in RRF order, so a query only one lane understands still has results.

IDs are opaque: fusion never sees text, so equal texts with different ACLs or versions
stay apart. Ties break by best single-lane rank, then ID, so the order is deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

FusionMode = Literal["rrf", "weighted", "layered"]
AGREEING_LANES = ("bm25", "dense")  # layered mode: what "both lanes" means
EXACT_LANE = "exact"


@dataclass(frozen=True)
class FusedHit:
    chunk_id: str  # or a document key, when documents are fused
    score: float
    ranks: dict[str, int | None]  # lane -> 1-based rank in that lane, None if absent


@dataclass(frozen=True)
class Ranking:
    ids: Sequence[str]  # best first
    scores: Sequence[float]  # the lane's own scores, same order


def _positions(rankings: Mapping[str, Ranking]) -> dict[str, dict[str, int]]:
    """id -> {lane: 1-based rank}, duplicates within a lane counted once."""
    ranks: dict[str, dict[str, int]] = {}
    for lane, ranking in rankings.items():
        position = 0
        for item in ranking.ids:
            entry = ranks.get(item)
            if entry is None:
                position += 1
                ranks[item] = {lane: position}
            elif lane not in entry:
                position += 1
                entry[lane] = position
    return ranks


@dataclass(frozen=True)
class Fusion:
    """Every candidate in fused order; hits are materialised only for what is shown."""

    order: list[str]
    scores: dict[str, float]
    ranks: dict[str, dict[str, int]]

    def hits(self, lanes: Sequence[str], limit: int | None = None) -> list[FusedHit]:
        return [
            FusedHit(item, self.scores[item], {lane: self.ranks[item].get(lane) for lane in lanes})
            for item in self.order[:limit]
        ]


def fusion(
    rankings: Mapping[str, Ranking],
    mode: FusionMode = "rrf",
    k: int = 60,
    weights: Mapping[str, float] | None = None,
) -> Fusion:
    ranks = _positions(rankings)
    if mode == "weighted":
        scores = _weighted(rankings, weights or {})
    else:
        # This runs on every request over a few hundred candidates per lane: the
        # reciprocal of each rank is looked up, not recomputed.
        depth = max((len(r.ids) for r in rankings.values()), default=0)
        reciprocal = [0.0, *(1.0 / (k + rank) for rank in range(1, depth + 1))]
        scores = {
            item: sum([reciprocal[r] for r in lanes.values()]) for item, lanes in ranks.items()
        }
        if mode == "layered":
            agreed = {
                item: score
                for item, score in scores.items()
                if EXACT_LANE in ranks[item] or all(lane in ranks[item] for lane in AGREEING_LANES)
            }
            scores = agreed or scores
    keyed = sorted((-score, min(ranks[item].values()), item) for item, score in scores.items())
    order = [item for _score, _best, item in keyed]
    return Fusion(order, scores, ranks)


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
