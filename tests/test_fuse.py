"""Reciprocal Rank Fusion: the formula, identity by chunk ID, determinism."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.policy.model import Policy
from gateway.retrieval.documents import fuse_documents
from gateway.retrieval.fuse import Ranking, fuse, reciprocal_rank_fusion


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


def test_weighted_fusion_normalises_each_lane() -> None:
    fused = fuse(
        {
            "bm25": Ranking(["a", "b", "c"], [12.0, 7.0, 2.0]),
            "dense": Ranking(["c", "a"], [0.9, 0.5]),
        },
        mode="weighted",
        weights={"bm25": 1.0, "dense": 2.0},
    )
    scores = {h.chunk_id: h.score for h in fused}
    # bm25 norm: a 1.0, b 0.5, c 0.0; dense norm: c 1.0, a 0.0; dense weighs 2.
    assert scores == {"a": 1.0, "b": 0.5, "c": 2.0}
    assert [h.chunk_id for h in fused] == ["c", "a", "b"]


def test_layered_keeps_what_both_lanes_agree_on_or_falls_back() -> None:
    agree = fuse(
        {
            "bm25": Ranking(["a", "b"], [2, 1]),
            "dense": Ranking(["b", "c"], [2, 1]),
            "exact": Ranking(["d"], [1]),
        },
        mode="layered",
    )
    assert [h.chunk_id for h in agree] == ["b", "d"]  # b: both lanes; d: quotes the identifier
    disagree = fuse({"bm25": Ranking(["a"], [1]), "dense": Ranking(["c"], [1])}, mode="layered")
    assert {h.chunk_id for h in disagree} == {"a", "c"}  # nothing agreed: plain RRF


def test_documents_collect_every_lanes_vote_through_any_chunk() -> None:
    rankings = {
        "bm25": Ranking(["x@1:0", "long@1:0", "y@1:0"], [3.0, 2.0, 1.0]),
        "dense": Ranking(["long@1:1", "y@1:0", "x@1:0"], [0.9, 0.8, 0.7]),
    }
    chunks = [h.chunk_id for h in fuse(rankings, lanes=["bm25", "dense"])]
    documents = fuse_documents(rankings, chunks, Policy(), ["bm25", "dense"])
    # "long" is second for bm25 (chunk 0) and first for dense (chunk 1): both votes count.
    assert [h.chunk_id for h in documents][:1] == ["long@1:1"]
    assert documents[0].ranks == {"bm25": 2, "dense": 1}
    assert {h.chunk_id.split("@")[0] for h in documents} == {"x", "long", "y"}


def test_layered_documents_keep_a_representative_chunk() -> None:
    rankings = {
        "bm25": Ranking(["a@1:0", "b@1:0"], [2.0, 1.0]),
        "dense": Ranking(["a@1:1", "c@1:0"], [0.9, 0.8]),
    }
    retrieval = {"fusion": "layered", "document_fusion": "layered"}
    policy = Policy.model_validate({"retrieval": retrieval})
    chunks = [h.chunk_id for h in fuse(rankings, "layered", lanes=["bm25", "dense"])]
    documents = fuse_documents(rankings, chunks, policy, ["bm25", "dense"])
    # Document "a" was found by both lanes (through different chunks): only it survives.
    assert [(h.chunk_id, h.ranks) for h in documents] == [("a@1:0", {"bm25": 1, "dense": 1})]
