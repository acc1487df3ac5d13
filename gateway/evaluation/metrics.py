"""Ranking metrics by document, as BEIR computes them (pytrec_eval's definitions).

`ranked` is a query's document IDs, best first, each at most once; `relevant` maps a
document ID to its graded relevance (qrels scores; 0 or less is not relevant).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def ndcg_at(ranked: Sequence[str], relevant: Mapping[str, int], k: int) -> float:
    """nDCG@k with gain = relevance and log2 discounts; the ideal ranking is every relevant
    document of the qrels in order of relevance, whether retrieved or not."""
    dcg = sum(
        relevant.get(doc, 0) / math.log2(position + 2)
        for position, doc in enumerate(ranked[:k])
        if relevant.get(doc, 0) > 0
    )
    ideal_gains = sorted((g for g in relevant.values() if g > 0), reverse=True)[:k]
    ideal = sum(g / math.log2(position + 2) for position, g in enumerate(ideal_gains))
    return dcg / ideal if ideal else 0.0


def recall_at(ranked: Sequence[str], relevant: Mapping[str, int], k: int) -> float:
    wanted = {doc for doc, g in relevant.items() if g > 0}
    return len(wanted.intersection(ranked[:k])) / len(wanted) if wanted else 0.0


def reciprocal_rank(ranked: Sequence[str], relevant: Mapping[str, int], k: int = 10) -> float:
    """1 / rank of the first relevant document within the top k (MRR@k when averaged)."""
    for position, doc in enumerate(ranked[:k], start=1):
        if relevant.get(doc, 0) > 0:
            return 1.0 / position
    return 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    index = max(0, math.ceil(q / 100 * len(ordered)) - 1)
    return ordered[index]
