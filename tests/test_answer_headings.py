"""Markdown headings in extractive answers, through real ingest and the real app.

A heading names a topic; it says nothing about it. A question that only a document's
heading matches is not answered by whatever sentence follows the heading, and a heading is
never quoted, on its own or ahead of a sentence that leans back on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.ingest import chunk
from gateway.ingest.pipeline import ingest_paths
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ALICE
from tests.helpers.documents import STAFF_EU, write_doc
from tests.helpers.identity import TokenFactory, bearer, make_settings

PARTY = "The annual summer party takes place in July at the lake. Families are welcome."
HOURS = "# Opening hours\nThe flagship store opens at nine and closes at eight on weekdays."

Serve = Callable[[str, str], TestClient]  # (document body, title) -> a client of the app


@pytest.fixture
def serve(tmp_path: Path, embedder: Embedder, jwks_file: Path) -> Iterator[Serve]:
    """The app over one document, ingested for real."""
    clients: list[TestClient] = []

    def start(body: str, title: str) -> TestClient:
        docs, data = tmp_path / "docs", tmp_path / "data"
        meta = {"doc_id": "doc", "title": title, **STAFF_EU, "effective_from": "2020-01-01"}
        write_doc(docs, "doc.md", meta, body)
        ingest_paths([docs], DataLayout(data), embedder)
        client = TestClient(create_app(make_settings(data, jwks_file), embedder=embedder))
        clients.append(client.__enter__())
        return client

    yield start
    for client in clients:
        client.__exit__(None, None, None)


def ask(client: TestClient, token: str, query: str) -> Any:
    response = client.post("/answer", json={"query": query}, headers=bearer(token))
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.slow
@pytest.mark.parametrize(
    "body",
    [
        "# Laptop encryption\n\n" + PARTY,
        # The first heading is a section of its own: a chunk that is only a heading.
        "# Laptop encryption\n\n## Windows\n\n" + PARTY,
    ],
    ids=["heading", "heading-then-heading"],
)
def test_a_question_only_a_heading_matches_is_not_answered(
    serve: Serve, make_token: TokenFactory, body: str
) -> None:
    """Was answered "# Laptop encryption The annual summer party takes place in July at the
    lake. [1]", and "# Laptop encryption [1]"; with the title in front matter only, the same
    document abstained."""
    client = serve(body, "Laptop encryption")
    payload = ask(client, make_token(**ALICE), "How do I enable laptop encryption?")
    assert payload["abstained"] is True, payload["answer"]
    assert payload["abstain_reason"] == "insufficient_evidence"
    assert payload["answer"] == "" and payload["citations"] == []


@pytest.mark.slow
def test_a_sentence_under_a_heading_is_quoted_without_it(
    serve: Serve, make_token: TokenFactory
) -> None:
    client = serve(HOURS, "Store")
    payload = ask(client, make_token(**ALICE), "When does the flagship store open?")
    assert payload["answer"] == (
        "The flagship store opens at nine and closes at eight on weekdays. [1]"
    )


@pytest.mark.slow
def test_a_sentence_leaning_back_does_not_bring_the_heading(
    serve: Serve, make_token: TokenFactory
) -> None:
    """ "It was built ..." brings the sentence before it along, but a heading is none."""
    client = serve("# Harbour tower\n\nIt was built in 1712 by the harbour guild.", "Port")
    payload = ask(client, make_token(**ALICE), "When was the harbour tower built?")
    assert payload["answer"] == "It was built in 1712 by the harbour guild. [1]"


@pytest.mark.slow
def test_a_chunk_ingested_before_headings_kept_their_line_is_answered_as_before(
    serve: Serve, make_token: TokenFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its text and its stored sentence vectors still match each other, until reindexed."""
    made = chunk.chunk_text  # as earlier releases made chunks: the heading on one line
    monkeypatch.setattr(
        chunk, "chunk_text", lambda *a: [(" ".join(t.split()), n) for t, n in made(*a)]
    )
    client = serve(HOURS + " It is closed on Sundays.", "Store")
    payload = ask(client, make_token(**ALICE), "When does the flagship store open?")
    assert payload["answer"].startswith(
        "# Opening hours The flagship store opens at nine and closes at eight on weekdays. [1]"
    )
