"""The answer stages on their own: sentences, late-chunked vectors, assembly, extraction."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from gateway.answer.context import Evidence, assemble
from gateway.answer.extractive import AnswerOptions, ExtractiveAnswerer
from gateway.answer.sentences import EvidenceSentence, evidence_sentences
from gateway.embedding import Embedder, pack_vectors
from gateway.ingest.chunk import sentence_spans, split_sentences
from gateway.retrieval.results import SearchHit


def hit(chunk_id: str, text: str) -> SearchHit:
    doc_id = chunk_id.split("@")[0]
    return SearchHit(chunk_id, doc_id, "1", doc_id, "", 0.1, text, {"bm25": 1, "dense": 1})


def words(n: int, word: str = "word") -> str:
    return " ".join([word] * n)


# -- sentences ------------------------------------------------------------------------------


def test_sentence_boundaries() -> None:
    text = "Refunds take 5 days, e.g. by card. Rule RPL-14.2 applies!\n\nNew paragraph here"
    assert split_sentences(text) == [
        "Refunds take 5 days, e.g. by card.",
        "Rule RPL-14.2 applies!",
        "New paragraph here",
    ]


@given(st.text(alphabet=st.sampled_from(list("ab. !?\n\tA1'#")), max_size=80))
def test_spans_are_ordered_trimmed_and_give_the_sentences(text: str) -> None:
    spans = sentence_spans(text)
    end = 0
    for a, b in spans:
        assert end <= a < b <= len(text)
        assert text[a:b] == text[a:b].strip()
        end = b
    assert split_sentences(text) == [" ".join(text[a:b].split()) for a, b in spans]


def test_late_chunked_sentence_vectors_point_at_their_sentence(embedder: Embedder) -> None:
    text = "Refunds are paid to the original card within five days. The store opens at nine."
    spans = sentence_spans(text)
    vectors, pooled = embedder.embed_with_spans([text], [spans])
    assert pooled[0].shape == (2, embedder.dim)
    assert np.allclose(np.linalg.norm(pooled[0], axis=1), 1.0, atol=1e-5)
    opening = embedder.embed_query("What time does the shop open in the morning?")
    refund = embedder.embed_query("How long until I get my money back?")
    assert int(np.argmax(pooled[0] @ opening)) == 1
    assert int(np.argmax(pooled[0] @ refund)) == 0
    # The whole-text vector is the model's own sentence embedding, spans or not.
    assert np.allclose(vectors[0], embedder.embed([text])[0], atol=1e-5)


def test_stored_vectors_are_used_and_stale_ones_are_recomputed(embedder: Embedder) -> None:
    fresh = hit("a@1:0", "One sentence here. Another one there.")
    stale = hit("b@1:0", "Only. Three. Sentences now.")
    missing = hit("c@1:0", "No vectors were stored for this chunk.")
    evidence = [Evidence(1, fresh, 10), Evidence(2, stale, 10), Evidence(3, missing, 10)]
    stored = {
        "a@1:0": pack_vectors(np.eye(2, embedder.dim, dtype=np.float32)),
        "b@1:0": pack_vectors(np.eye(1, embedder.dim, dtype=np.float32)),  # count differs
    }
    sentences, embedded_now = evidence_sentences(evidence, lambda ids: stored, embedder)
    assert embedded_now == 2
    assert [(s.n, s.position) for s in sentences] == [
        (1, 0),
        (1, 1),
        (2, 0),
        (2, 1),
        (2, 2),
        (3, 0),
    ]
    assert sentences[1].vector[1] == 1.0  # the stored row, not a fresh embedding
    recomputed = embedder.embed(["Only."])[0]
    assert np.allclose(sentences[2].vector, recomputed, atol=1e-5)


# -- assembly ---------------------------------------------------------------------------------


def test_assembly_keeps_fused_order_drops_copies_and_respects_the_budget() -> None:
    hits = [
        hit("a@1:0", "Gift cards never expire and can be used in any store."),
        hit("b@1:0", "Gift cards never expire and can be used in any store."),  # other ACL
        hit("c@1:0", words(50, "long")),
        hit("d@1:0", "Short tail evidence."),
    ]
    assembly = assemble(hits, budget_tokens=30, count_tokens=lambda t: len(t.split()))
    assert [(e.n, e.hit.chunk_id) for e in assembly.evidence] == [(1, "a@1:0"), (2, "d@1:0")]
    assert assembly.dropped_duplicates == 1 and assembly.dropped_budget == 1
    assert assembly.tokens == 14 <= 30


# -- extraction -------------------------------------------------------------------------------


def sentence(n: int, position: int, text: str, direction: int, dim: int = 4) -> EvidenceSentence:
    vector = np.zeros(dim, dtype=np.float32)
    vector[direction] = 1.0
    return EvidenceSentence(n, position, text, vector)


QUERY = np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32)


def test_best_sentences_in_reading_order_with_their_numbers() -> None:
    answerer = ExtractiveAnswerer(AnswerOptions(min_relevance=0.5))
    sentences = [
        sentence(1, 0, "Unrelated opening.", 1),
        sentence(1, 1, "Refunds are paid within five days.", 0),
        sentence(2, 0, "Refunds are paid to the original card.", 0),
    ]
    answer = answerer.answer("when are refunds paid", QUERY, sentences)
    assert not answer.abstained
    assert answer.text == (
        "Refunds are paid within five days. [1] Refunds are paid to the original card. [2]"
    )
    assert answer.cited == [1, 2]


def test_citations_are_numbered_in_the_order_the_reader_meets_them() -> None:
    answerer = ExtractiveAnswerer(AnswerOptions(min_relevance=0.5))
    sentences = [
        sentence(2, 0, "Refunds are paid within five days.", 0),
        sentence(5, 0, "Refunds are paid to the original card.", 0),
    ]
    answer = answerer.answer("when are refunds paid", QUERY, sentences)
    assert answer.text == (
        "Refunds are paid within five days. [1] Refunds are paid to the original card. [2]"
    )
    assert answer.cited == [2, 5]  # [1] is evidence block 2, [2] is block 5


def test_weak_evidence_abstains_and_no_evidence_says_so() -> None:
    answerer = ExtractiveAnswerer(AnswerOptions(min_relevance=0.5))
    weak = answerer.answer("refunds", QUERY, [sentence(1, 0, "Fire exits stay clear.", 2)])
    assert weak.abstained and weak.reason == "insufficient_evidence" and weak.text == ""
    empty = answerer.answer("refunds", QUERY, [])
    assert empty.abstained and empty.reason == "no_permitted_evidence"


def test_word_limit_counts_citation_markers_and_cuts_a_long_sentence() -> None:
    answerer = ExtractiveAnswerer(AnswerOptions(min_relevance=0.5, max_words=20))
    fits = [sentence(1, 0, words(9, "a"), 0), sentence(2, 0, words(9, "b"), 0)]
    answer = answerer.answer("a", QUERY, fits)
    assert len(answer.text.split()) == 20 and answer.cited == [1, 2]
    too_long = answerer.answer("a", QUERY, [sentence(1, 0, words(60, "a"), 0)])
    assert len(too_long.text.split()) <= 20
    assert too_long.text.endswith("… [1]")


def test_query_vector_cache_is_partitioned_by_caller(embedder: Embedder) -> None:
    text = "a question only asked in this test"
    before = embedder._embed_query_cached.cache_info()
    first = embedder.embed_query(text, scope="acme/alice")
    embedder.embed_query(text, scope="acme/alice")
    other = embedder.embed_query(text, scope="acme/bob")
    after = embedder._embed_query_cached.cache_info()
    # One miss per caller, one hit: bob never learns (by timing) that alice asked.
    assert (after.misses - before.misses, after.hits - before.hits) == (2, 1)
    assert np.array_equal(first, other)


def test_a_sentence_that_leans_back_brings_the_one_before_it() -> None:
    answerer = ExtractiveAnswerer(AnswerOptions(max_sentences=2, min_relevance=0.0))
    query = np.array([1.0, 0.0])
    sentences = [
        EvidenceSentence(1, 0, "Thomas Newcomen built an engine.", np.array([0.2, 1.0])),
        EvidenceSentence(1, 1, "It pumped water from mines in 1712.", np.array([1.0, 0.0])),
        EvidenceSentence(1, 2, "Watt improved it later.", np.array([0.1, 1.0])),
    ]
    answer = answerer.answer("When did the engine pump water?", query, sentences)
    assert answer.text == (
        "Thomas Newcomen built an engine. [1] It pumped water from mines in 1712. [1]"
    )
    # Without room for the antecedent, in words or sentences, the best sentence stands alone.
    for options in (AnswerOptions(max_words=10), AnswerOptions(max_sentences=1)):
        tight = ExtractiveAnswerer(dataclasses.replace(options, min_relevance=0.0))
        alone = tight.answer("When did the engine pump water?", query, sentences)
        assert alone.text == "It pumped water from mines in 1712. [1]"


def test_an_antecedent_counts_toward_max_sentences_before_a_weaker_runner_up() -> None:
    """The best sentence's antecedent takes the second place, not the runner-up: quoted
    after another sentence, "It" would seem to point at that one."""
    answerer = ExtractiveAnswerer(AnswerOptions(max_sentences=2, min_relevance=0.0))
    query = np.array([1.0, 0.0])
    sentences = [
        EvidenceSentence(1, 0, "Thomas Newcomen built an engine.", np.array([0.2, 1.0])),
        EvidenceSentence(1, 1, "It pumped water from mines in 1712.", np.array([1.0, 0.0])),
        EvidenceSentence(2, 0, "Pumps kept water out of mines.", np.array([0.98, 0.2])),
    ]
    answer = answerer.answer("When did the engine pump water from mines?", query, sentences)
    assert answer.text == (
        "Thomas Newcomen built an engine. [1] It pumped water from mines in 1712. [1]"
    )
    assert answer.cited == [1]
