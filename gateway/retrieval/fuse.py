"""Fusion of ranked lanes by chunk ID."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FusedHit:
    chunk_id: str
    score: float
    ranks: dict[str, int | None]  # lane -> 1-based rank in that lane, None if absent


def reciprocal_rank_fusion(
    rankings: Mapping[str, Sequence[str]], k: int = 60, lanes: Sequence[str] = ()
) -> list[FusedHit]:
    """RRF: score(c) = sum over lanes L containing c of 1 / (k + rank_L(c)), ranks 1-based.

    Chunks are identified by ID only, never by text, so equal texts with different ACLs or
    versions stay apart. Ties break by best single-lane rank, then chunk ID, so the order
    is deterministic. `lanes` names every lane that ran (so absent ones report None).
    """
    names = list(dict.fromkeys([*lanes, *rankings]))
    scores: dict[str, float] = {}
    ranks: dict[str, dict[str, int | None]] = {}
    for lane, ranked in rankings.items():
        for position, chunk_id in enumerate(dict.fromkeys(ranked), start=1):
            scores[chunk_id] = scores.get(chunk_id, 0.0) + 1.0 / (k + position)
            ranks.setdefault(chunk_id, dict.fromkeys(names))[lane] = position

    def order(chunk_id: str) -> tuple[float, int, str]:
        best = min(r for r in ranks[chunk_id].values() if r is not None)
        return (-scores[chunk_id], best, chunk_id)

    return [FusedHit(c, scores[c], ranks[c]) for c in sorted(scores, key=order)]
