"""What telemetry must never carry, and a run of requests that exercises every stage."""

from __future__ import annotations

import json
from urllib.parse import quote

from fastapi.testclient import TestClient

from gateway.ingest.chunk import split_sentences
from tests.helpers.callers import ALICE, BOB
from tests.helpers.documents import CORPUS
from tests.helpers.identity import TokenFactory, bearer

QUERIES = (
    "How quickly are refunds paid?",
    "What happens to merchants above the chargeback threshold?",
    "What is the boiling point of liquid nitrogen?",
    "RPL-14",
)


def forbidden_texts(answers: list[str]) -> list[str]:
    """Everything that must never leave in a span: queries, titles, sentences, answers."""
    texts = [*QUERIES, *answers]
    for _name, meta, body in CORPUS:
        texts.append(meta["title"])
        texts.extend(s for s in split_sentences(body) if len(s) > 12)
    return [t for t in texts if t]


def exercise(client: TestClient, make_token: TokenFactory) -> tuple[list[str], list[str]]:
    """Every traced route, as callers with different rights; returns answers and trace IDs."""
    answers, trace_ids = [], []
    for caller in (ALICE, BOB):
        token = make_token(**caller)
        for query in QUERIES:
            found = client.post("/search", json={"query": query}, headers=bearer(token))
            said = client.post("/answer", json={"query": query}, headers=bearer(token))
            assert found.status_code == said.status_code == 200
            answers.append(said.json()["answer"])
            trace_ids += [found.json()["trace_id"], said.json()["trace_id"]]
        assert client.get("/documents/refund-policy", headers=bearer(token)).status_code == 200
        assert client.get("/documents/merchant-fraud", headers=bearer(token)).status_code in (
            200,
            404,
        )
        chunk = "/chunks/" + quote("refund-policy@2:0", safe="")
        assert client.get(chunk, headers=bearer(token)).status_code == 200
    for caller in (ALICE, BOB):  # streamed answers end their span in the streaming task
        body = {"query": QUERIES[0], "stream": True}
        streamed = client.post("/answer", json=body, headers=bearer(make_token(**caller)))
        final = json.loads(streamed.text.strip().split("\n\n")[-1].split("data: ", 1)[1])
        answers.append(final["answer"])
        trace_ids.append(final["trace_id"])
    return answers, trace_ids


STAGES = {
    "authenticate",
    "resolve",
    "restrict",
    "embed_query",
    "bm25",
    "dense",
    "fuse",
    "rerank",
    "expand",
    "assemble",
    "answer",
}
