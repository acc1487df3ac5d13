"""Reciprocal Rank Fusion: the formula, identity by chunk ID, determinism."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.retrieval.fuse import reciprocal_rank_fusion


def test_formula_with_k_60_and_one_based_ranks() -> None:
    fused = reciprocal_rank_fusion({"bm25": ["a", "b"], "dense": ["b", "c"]}, k=60)
    scores = {h.chunk_id: h.score for h in fused}
    assert scores["b"] == 1 / 62 + 1 / 61
    assert scores["a"] == 1 / 61 and scores["c"] == 1 / 62
    assert [h.chunk_id for h in fused] == ["b", "a", "c"]
    assert fused[0].ranks == {"bm25": 2, "dense": 1}
    assert fused[1].ranks == {"bm25": 1, "dense": None}


def test_absent_lane_reports_none_for_every_hit() -> None:
    fused = reciprocal_rank_fusion({"bm25": ["a"]}, lanes=["bm25", "dense"])
    assert fused[0].ranks == {"bm25": 1, "dense": None}


def test_same_text_different_ids_stay_two_hits() -> None:
    # Fusion never sees text: two versions with identical bodies are two chunk IDs.
    fused = reciprocal_rank_fusion({"bm25": ["doc@1:0", "doc@2:0"], "dense": ["doc@2:0"]})
    assert {h.chunk_id for h in fused} == {"doc@1:0", "doc@2:0"}


ids = st.lists(st.sampled_from("abcdefghij"), unique=True, max_size=10)


@given(bm25=ids, dense=ids)
def test_fusion_is_a_permutation_of_the_union_and_sorted(bm25: list[str], dense: list[str]) -> None:
    fused = reciprocal_rank_fusion({"bm25": bm25, "dense": dense})
    assert sorted(h.chunk_id for h in fused) == sorted(set(bm25) | set(dense))
    assert all(a.score >= b.score for a, b in zip(fused, fused[1:], strict=False))
    # A chunk ranked first by both lanes is first overall.
    if bm25 and dense and bm25[0] == dense[0]:
        assert fused[0].chunk_id == bm25[0]
