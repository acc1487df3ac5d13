"""What answers quote of a document: its own bracketed numbers and its links, through the
real app over a corpus of its own (extractive answers, and an LLM faked at the transport).

Answers cite evidence as `[n]`. A document that writes "see [2]" itself must not put a
citation in the answer that the answerer never made (or lose its words), and a document's
tracking image must not reach a chat client that renders the answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from gateway.answer.prompt import SYSTEM
from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.policy.loader import DEFAULT_POLICY_DIR
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ALICE
from tests.helpers.documents import STAFF_EU, write_doc
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.llm import FakeLlm, blocks_of, llm_apps

# An answer's own citation markers, as docs/api.md, "`POST /answer`" defines them: `[n]`
# that is neither escaped (`\[2\]`, a document's own text) nor stuck to a word (`buffer[0]`, code).
OURS = re.compile(r"(?<![\w\\])\[(\d+)\]")
TRACKER = "https://tracker.example/pixel.gif?u=7"

CACHE = (
    "# Cache operations\n\n"
    "The warm cache is rebuilt every night at 02:00 by the indexer, as described in [2]. "
    "Reading buffer[0] returns the oldest entry of the ring buffer.\n\n"
    "Operators page the storage team when the rebuild fails twice."
)
LOYALTY = (
    "# Loyalty card\n\n"
    f"The loyalty card gives three points for every euro spent in stores. ![]({TRACKER})\n\n"
    "Points expire after two years."
)
PLAIN = "# Opening hours\n\nThe flagship store opens at nine and closes at eight on weekdays."


@pytest.fixture(scope="module")
def quotes_data(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Path:
    docs = tmp_path_factory.mktemp("quotes-docs")
    for name, doc_id, body in (
        ("cache.md", "cache-ops", CACHE),
        ("loyalty.md", "loyalty-card", LOYALTY),
        ("hours.md", "opening-hours", PLAIN),
    ):
        meta = {"doc_id": doc_id, **STAFF_EU, "effective_from": "2020-01-01"}
        write_doc(docs, name, {**meta, "uri": f"https://wiki.example/{doc_id}"}, body)
    root = tmp_path_factory.mktemp("quotes-data")
    ingest_paths([docs], DataLayout(root), embedder)
    return root


@pytest.fixture(scope="module")
def quotes_client(quotes_data: Path, jwks_file: Path, embedder: Embedder) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(quotes_data, jwks_file), embedder=embedder)) as c:
        yield c


@pytest.fixture
def llm_client(
    quotes_data: Path, jwks_file: Path, embedder: Embedder
) -> Iterator[Callable[[FakeLlm], TestClient]]:
    with llm_apps(quotes_data, jwks_file, embedder) as start:
        yield start


def ask(client: TestClient, token: str, query: str, **body: Any) -> Any:
    response = client.post("/answer", json={"query": query, **body}, headers=bearer(token))
    assert response.status_code == 200, response.text
    return response.json()


def assert_markers_are_citations(payload: Any) -> None:
    shown = {int(n) for n in OURS.findall(payload["answer"])}
    assert shown == {c["n"] for c in payload["citations"]}, payload["answer"]


# -- extractive answers -------------------------------------------------------------------


def test_a_documents_own_bracket_number_is_quoted_escaped_not_as_a_citation(
    quotes_client: TestClient, make_token: TokenFactory
) -> None:
    payload = ask(quotes_client, make_token(**ALICE), "When is the warm cache rebuilt?")
    assert payload["abstained"] is False
    assert "as described in \\[2\\]." in payload["answer"]  # Markdown shows it as "[2]"
    assert [c["doc_id"] for c in payload["citations"]] == ["cache-ops"]
    assert_markers_are_citations(payload)


def test_quoted_code_with_an_index_is_unchanged(
    quotes_client: TestClient, make_token: TokenFactory
) -> None:
    payload = ask(quotes_client, make_token(**ALICE), "What does reading buffer[0] return?")
    assert "Reading buffer[0] returns the oldest entry of the ring buffer." in payload["answer"]
    assert_markers_are_citations(payload)


def test_an_answer_from_a_document_without_brackets_is_as_before(
    quotes_client: TestClient, make_token: TokenFactory
) -> None:
    payload = ask(quotes_client, make_token(**ALICE), "When does the flagship store open?")
    assert payload["answer"] == (
        "The flagship store opens at nine and closes at eight on weekdays. [1]"
    )


def test_a_documents_tracking_image_is_not_quoted(
    quotes_client: TestClient, make_token: TokenFactory
) -> None:
    query = "How many points does the loyalty card give for every euro?"
    for streamed in (False, True):
        if streamed:
            response = quotes_client.post(
                "/answer", json={"query": query, "stream": True}, headers=bearer(make_token())
            )
            assert response.status_code == 200
            text = response.text
        else:
            payload = ask(quotes_client, make_token(**ALICE), query)
            assert payload["abstained"] is False
            assert "three points for every euro" in payload["answer"]
            assert payload["citations"][0]["doc_id"] == "loyalty-card"
            text = payload["answer"]
        assert "tracker.example" not in text and "![" not in text


def test_the_openai_surface_quotes_escaped_too(
    quotes_client: TestClient, make_token: TokenFactory
) -> None:
    body = {
        "model": "gateway",
        "messages": [{"role": "user", "content": "When is the warm cache rebuilt?"}],
    }
    response = quotes_client.post("/v1/chat/completions", json=body, headers=bearer(make_token()))
    assert response.status_code == 200, response.text
    content = response.json()["choices"][0]["message"]["content"]
    assert "\\[2\\]" in content and "tracker" not in content
    shown = {int(n) for n in OURS.findall(content)}
    assert shown == {c["n"] for c in response.json()["citations"]}


ENGINE = (
    "Thomas Newcomen built the first practical steam engine in England. "
    "It pumped water out of flooded coal mines from 1712 onwards. "
    "The parish council repaired the church roof in the same decade."
)


@pytest.mark.parametrize("max_sentences", [1, 2])
def test_an_answer_has_at_most_max_sentences_counting_the_one_it_leans_on(
    tmp_path: Path,
    jwks_file: Path,
    embedder: Embedder,
    make_token: TokenFactory,
    max_sentences: int,
) -> None:
    """The best sentence ("It pumped water...") brings the sentence it leans on, as one of
    `answering.max_sentences`: with 1 it stands alone, with 2 the pair is the answer."""
    docs = tmp_path / "docs"
    meta = {"doc_id": "steam", "title": "Steam engines", **STAFF_EU, "effective_from": "2020-01-01"}
    write_doc(docs, "steam.md", meta, ENGINE)
    ingest_paths([docs], DataLayout(tmp_path / "data"), embedder)
    policy = yaml.safe_load((DEFAULT_POLICY_DIR / "policy.yaml").read_text())
    policy["answering"]["max_sentences"] = max_sentences
    policy_dir = tmp_path / "policy"
    policy_dir.mkdir()
    (policy_dir / "policy.yaml").write_text(yaml.safe_dump(policy))
    settings = make_settings(tmp_path / "data", jwks_file, policy_dir)
    with TestClient(create_app(settings, embedder=embedder)) as client:
        query = "When did the steam engine start pumping water out of mines?"
        payload = ask(client, make_token(**ALICE), query)
    sentences = [
        "Thomas Newcomen built the first practical steam engine in England. [1]",
        "It pumped water out of flooded coal mines from 1712 onwards. [1]",
    ]
    assert payload["answer"] == " ".join(sentences[-max_sentences:])


# -- LLM answers --------------------------------------------------------------------------


def block_with(blocks: dict[int, str], words: str) -> tuple[int, str]:
    return next((n, text) for n, text in blocks.items() if words in text)


def test_an_llm_copying_a_documents_bracket_number_does_not_cite_with_it(
    llm_client: Callable[[FakeLlm], TestClient], make_token: TokenFactory
) -> None:
    """The model copies the sentence as the prompt shows it; the document's `[2]` there
    was neither kept as a citation of block 2 nor dropped from the words."""
    seen: dict[int, str] = {}

    def reply(blocks: dict[int, str]) -> str:
        seen.update(blocks)
        n, text = block_with(blocks, "warm cache is rebuilt")
        other = next(m for m in blocks if m != n)  # so a [2] of the document could match
        quoted = re.search(r"The warm cache[^\n]*?\. ", text)
        assert quoted is not None and other
        return f"{quoted.group(0).strip()} [{n}]"

    payload = ask(
        llm_client(FakeLlm(reply)), make_token(**ALICE), "When is the warm cache rebuilt?"
    )
    assert len(seen) >= 2  # a block 2 was given: the document's [2] would have cited it
    assert payload["abstained"] is False
    assert "as described in \\[2\\]." in payload["answer"]
    assert [c["doc_id"] for c in payload["citations"]] == ["cache-ops"]
    assert_markers_are_citations(payload)


def test_an_llm_quoting_code_keeps_it_whole(
    llm_client: Callable[[FakeLlm], TestClient], make_token: TokenFactory
) -> None:
    """`buffer[0]` as the model copies it from the prompt: the answer shows it as the
    document wrote it, neither `buffer` (a marker dropped) nor a citation."""

    def reply(blocks: dict[int, str]) -> str:
        n, text = block_with(blocks, "Reading buffer")
        quoted = re.search(r"Reading buffer\S* returns", text)
        assert quoted is not None
        return f"{quoted.group(0)} the oldest entry [{n}]."

    payload = ask(llm_client(FakeLlm(reply)), make_token(**ALICE), "What does buffer[0] return?")
    assert payload["answer"] == "Reading buffer[0] returns the oldest entry [1]."
    assert_markers_are_citations(payload)


def test_an_llm_writing_code_without_its_escape_keeps_it_whole(
    llm_client: Callable[[FakeLlm], TestClient], make_token: TokenFactory
) -> None:
    """A model may drop the prompt's escape and write `buffer[0]`: [0] names no block, and
    stuck to a word it is code, quoted as written, not a citation to drop."""

    def reply(blocks: dict[int, str]) -> str:
        n, _text = block_with(blocks, "Reading buffer")
        return f"Reading buffer[0] returns the oldest entry [{n}]."

    payload = ask(llm_client(FakeLlm(reply)), make_token(**ALICE), "What does buffer[0] return?")
    assert payload["answer"] == "Reading buffer[0] returns the oldest entry [1]."
    assert len(payload["citations"]) == 1


def test_the_prompt_is_unchanged_for_documents_without_brackets(
    llm_client: Callable[[FakeLlm], TestClient], make_token: TokenFactory
) -> None:
    fake = FakeLlm(lambda blocks: "It opens at nine [1].")
    query = "When does the flagship store open?"
    payload = ask(llm_client(fake), make_token(**ALICE), query, top_k=1)
    assert payload["answer"] == "It opens at nine [1]."
    (request,) = fake.requests
    assert request["messages"][0]["content"] == SYSTEM
    # The chunk's text: the heading on a line of its own, the rest with its spaces collapsed.
    assert list(blocks_of(request).values()) == [
        "Title: Opening hours\n# Opening hours\n"
        "The flagship store opens at nine and closes at eight on weekdays."
    ]


def test_an_llm_marker_stuck_to_a_word_is_shown_apart_from_it(
    llm_client: Callable[[FakeLlm], TestClient], make_token: TokenFactory
) -> None:
    """In an answer a bracket right after a word is code's (`buffer[0]`), so the model's own
    "02:00[3]" is shown as "02:00 [1]", a marker a client reads as the citation it is."""

    def reply(blocks: dict[int, str]) -> str:
        return f"The cache is rebuilt at 02:00[{block_with(blocks, 'warm cache')[0]}]."

    payload = ask(llm_client(FakeLlm(reply)), make_token(**ALICE), "When is the cache rebuilt?")
    assert payload["answer"] == "The cache is rebuilt at 02:00 [1]."
    assert [c["doc_id"] for c in payload["citations"]] == ["cache-ops"]
    assert_markers_are_citations(payload)
