"""The exact dense engine's ranking rule (gateway/storage/flat.py `_best`): scores within
TIE of a tie's best are tied and go by table row, measured from the best, not chained."""

from __future__ import annotations

import numpy as np

from gateway.storage.flat import TIE, _best


def ranked(scores: list[float], table_rows: list[int], limit: int) -> list[int]:
    rows = np.array(table_rows)
    return _best(np.array(scores), limit, lambda picked: rows[picked]).tolist()


def test_a_tie_is_measured_from_its_best_so_the_best_n_lead_every_longer_list() -> None:
    """Three scores 0.7 TIE apart, the table's order the other way round: the first two
    are a tie (table order), the third is not in it though it is within TIE of the
    second. Chained neighbour to neighbour, all three were one tie, and the best one
    alone was not the first of the best two."""
    scores, rows = [0.5, 0.5 - 0.7 * TIE, 0.5 - 1.4 * TIE], [2, 1, 0]
    assert ranked(scores, rows, 3) == [1, 0, 2]
    for limit in (1, 2, 3):
        assert ranked(scores, rows, limit) == [1, 0, 2][:limit]


def test_every_limit_is_a_prefix_of_the_longer_lists() -> None:
    rng = np.random.default_rng(4)
    for _ in range(300):
        size = int(rng.integers(1, 40))
        steps = rng.choice([0.0, 0.4 * TIE, 0.9 * TIE, 1.7 * TIE, 1e-3], size=size)
        scores = (0.6 - np.cumsum(steps))[rng.permutation(size)].tolist()
        rows = rng.permutation(size).tolist()
        whole = ranked(scores, rows, size)
        assert sorted(whole) == list(range(size))
        for limit in range(1, size + 2):
            assert ranked(scores, rows, limit) == whole[:limit]


def test_nothing_asked_or_nothing_to_rank_gives_nothing() -> None:
    assert ranked([], [], 5) == [] and ranked([0.3], [0], 0) == []
