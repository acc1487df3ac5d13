"""The extractive answer quotes a sentence once, though the evidence holds it more than
once: overlapping chunks repeat the sentences at their seam, and copies say it again."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gateway.answer.extractive import AnswerOptions, ExtractiveAnswerer
from gateway.answer.sentences import EvidenceSentence
from gateway.embedding import Embedder
from tests.helpers.callers import ALICE
from tests.helpers.documents import doc
from tests.helpers.identity import TokenFactory, bearer
from tests.helpers.push_app import push_app

RULE = "The walrus rule WR-1 says freezers are checked every four hours."


def test_a_sentence_in_the_overlap_of_two_chunks_is_quoted_once(
    tmp_path: Path, embedder: Embedder, jwks_file: Path, make_token: TokenFactory
) -> None:
    # Long enough for several chunks; the rule sits where one chunk ends and the next
    # begins again (the default chunking overlaps them).
    sentences = [
        f"Section note {n} describes the ordinary handling of pallets in aisle {n}."
        for n in range(30)
    ]
    sentences[15] = RULE
    with push_app(tmp_path, embedder, jwks_file) as app:
        client, writer, key = app
        pushed = doc("walrus", text=" ".join(sentences))
        r = client.post("/admin/documents", json={"documents": [pushed]}, headers=bearer(key))
        assert r.status_code == 202, r.text
        assert writer.run_once() == 1
        alice = bearer(make_token(**ALICE))
        holding = []
        for chunk_id in client.get("/documents/walrus", headers=alice).json()["chunk_ids"]:
            if RULE in client.get(f"/chunks/{chunk_id}", headers=alice).json()["text"]:
                holding.append(chunk_id)
        assert len(holding) == 2, holding  # the premise: the rule is in two chunks

        answered = client.post(
            "/answer",
            json={"query": "How often are freezers checked under the walrus rule?"},
            headers=alice,
        )
        assert answered.status_code == 200, answered.text
        answer = answered.json()
        assert answer["answer"].count(RULE) == 1, answer["answer"]
        assert f"{RULE} [1]" in answer["answer"]  # cited once, to a chunk that holds it
        assert answer["citations"][0]["chunk_id"] in holding


def test_copies_differing_in_spacing_or_case_are_quoted_once_and_free_the_place() -> None:
    answerer = ExtractiveAnswerer(AnswerOptions(max_sentences=2, min_relevance=0.0))
    query = np.array([1.0, 0.0])
    sentences = [
        EvidenceSentence(1, 0, "Freezers are checked every four hours.", np.array([1.0, 0.0])),
        EvidenceSentence(2, 0, "FREEZERS are checked  every four hours.", np.array([0.99, 0.1])),
        EvidenceSentence(3, 0, "Freezers are checked by the night shift.", np.array([0.95, 0.3])),
    ]
    answer = answerer.answer("How often are freezers checked?", query, sentences)
    # The copy's place goes to the next runner-up, and block 2 is not cited.
    assert answer.text == (
        "Freezers are checked every four hours. [1] Freezers are checked by the night shift. [2]"
    )
    assert answer.cited == [1, 3]
