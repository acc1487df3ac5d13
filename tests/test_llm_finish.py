"""How an LLM's answer ends, through the real app with the endpoint faked at the HTTP
transport: an answer the endpoint did not finish is never served as a whole one, and an
answer gives its LLM slot back when it is done, whichever door it came through."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from gateway.embedding import Embedder
from tests.helpers.callers import ALICE
from tests.helpers.identity import TokenFactory, bearer
from tests.helpers.llm import FakeLlm, llm_app_of, llm_apps
from tests.test_llm_answers import QUESTION, ask, events_of, policy_dir

# The extractive answer to QUESTION, which serves when the LLM's does not.
EXTRACTIVE = "Refunds are paid within 5 days under rule RPL-14. [1]"
CHAT = {"model": "gateway", "messages": [{"role": "user", "content": QUESTION}]}
# Lanes with room: on a loaded machine a lane past its default budget is degraded too, and
# these tests read `degraded` for the LLM alone.
ROOMY = {"bm25_ms": 30_000, "dense_ms": 30_000, "exact_ms": 30_000}


@pytest.fixture
def llm_app(
    data_dir: Path, jwks_file: Path, embedder: Embedder, tmp_path: Path
) -> Iterator[Callable[..., TestClient]]:
    """Starts an app answering through `fake`, under the default policy with roomy lanes
    and the `llm` settings given."""
    with llm_apps(data_dir, jwks_file, embedder) as start:

        def started(fake: FakeLlm, **llm: Any) -> TestClient:
            return start(fake, policy_dir(tmp_path / "policy", budgets=ROOMY, llm=llm))

        yield started


def cited(*sentences: str) -> Callable[[dict[int, str]], str]:
    """The model's reply: `sentences` joined, `{n}` the refund policy's block number."""

    def reply(blocks: dict[int, str]) -> str:
        n = next(n for n, text in blocks.items() if "RPL-14" in text)
        return " ".join(sentences).replace("{n}", str(n))

    return reply


def streamed_final(client: TestClient, token: str) -> tuple[str, dict[str, Any]]:
    """/answer streamed: the text of its tokens, and its final event."""
    response = client.post(
        "/answer", json={"query": QUESTION, "stream": True}, headers=bearer(token)
    )
    assert response.status_code == 200, response.text
    events = events_of(response.text)
    assert events[-1][0] == "final", events
    return "".join(d["text"] for kind, d in events if kind == "token"), events[-1][1]


@pytest.mark.parametrize(
    ("finish", "done"),
    [
        ("content_filter", True),  # the provider's filter stopped the model
        (None, False),  # a proxy closed the stream after the upstream died
        (None, True),  # `[DONE]` but no finish_reason: no conforming server ends so
    ],
)
def test_an_answer_the_endpoint_did_not_finish_degrades_to_the_extractive_answer(
    llm_app: Callable[..., TestClient],
    make_token: TokenFactory,
    finish: str | None,
    done: bool,
) -> None:
    reply = cited("Refunds are paid within 5 days [{n}].", "However, refunds are not")
    client, token = llm_app(FakeLlm(reply, finish=finish, done=done)), make_token(**ALICE)
    payload = ask(client, token)
    assert payload["degraded"] == ["llm"] and payload["answer"] == EXTRACTIVE
    tokens, final = streamed_final(client, token)
    assert "However, refunds are" in tokens  # sent before the end was known...
    assert final["degraded"] == ["llm"] and final["answer"] == EXTRACTIVE  # ...superseded
    chat = client.post("/v1/chat/completions", json=CHAT, headers=bearer(token))
    assert chat.status_code == 200, chat.text
    assert chat.json()["gateway"]["degraded"] == ["llm"]
    assert chat.json()["choices"][0]["message"]["content"] == EXTRACTIVE


def test_a_finished_answer_without_done_is_served(
    llm_app: Callable[..., TestClient], make_token: TokenFactory
) -> None:
    """The finish reason is what tells a whole answer: `[DONE]` after it adds nothing."""
    fake = FakeLlm(cited("Refunds are paid within 5 days [{n}]."), done=False)
    payload = ask(llm_app(fake), make_token(**ALICE))
    assert payload["degraded"] == [] and payload["answer"] == "Refunds are paid within 5 days [1]."


def test_an_answer_stopped_at_its_token_bound_keeps_its_whole_cited_sentences(
    llm_app: Callable[..., TestClient], make_token: TokenFactory
) -> None:
    reply = cited(
        "Refunds are paid within 5 days [{n}].",
        "Card refunds go back to the card.",  # whole, but its citation may have been next
        "Cash refunds are",
    )
    client, token = llm_app(FakeLlm(reply, finish="length")), make_token(**ALICE)
    payload = ask(client, token)
    assert payload["degraded"] == [] and payload["abstained"] is False
    assert payload["answer"] == "Refunds are paid within 5 days [1]."
    assert [c["chunk_id"] for c in payload["citations"]] == ["refund-policy@2:0"]
    tokens, final = streamed_final(client, token)
    assert tokens.endswith("Cash refunds are")  # streamed as produced...
    assert final["answer"] == "Refunds are paid within 5 days [1]."  # ...the final is whole
    assert payload["truncated"] is True and final["truncated"] is True
    chat = client.post("/v1/chat/completions", json=CHAT, headers=bearer(token))
    choice = chat.json()["choices"][0]
    assert choice["message"]["content"] == payload["answer"]
    assert choice["finish_reason"] == "length"  # a chat may offer to continue it
    streamed = client.post(
        "/v1/chat/completions", json={**CHAT, "stream": True}, headers=bearer(token)
    )
    reasons = [
        c["choices"][0]["finish_reason"]
        for line in streamed.text.splitlines()
        if line.startswith("data: {") and (c := json.loads(line[len("data: ") :]))
    ]
    assert reasons[-1] == "length" and not any(reasons[:-1])


def test_a_whole_answer_is_not_truncated(
    llm_app: Callable[..., TestClient], make_token: TokenFactory
) -> None:
    whole = FakeLlm(cited("Refunds are paid within 5 days [{n}]."))
    client, token = llm_app(whole), make_token(**ALICE)
    assert ask(client, token)["truncated"] is False
    chat = client.post("/v1/chat/completions", json=CHAT, headers=bearer(token))
    assert chat.json()["choices"][0]["finish_reason"] == "stop"


def test_an_answer_stopped_before_any_whole_cited_sentence_degrades(
    llm_app: Callable[..., TestClient], make_token: TokenFactory
) -> None:
    reply = cited("Refunds are paid, as rule [{n}] says, within")
    payload = ask(llm_app(FakeLlm(reply, finish="length")), make_token(**ALICE))
    assert payload["degraded"] == ["llm"] and payload["answer"] == EXTRACTIVE


def test_an_answer_the_gateway_cuts_at_answer_tokens_keeps_its_whole_cited_sentences(
    llm_app: Callable[..., TestClient], make_token: TokenFactory
) -> None:
    """A provider that ignores max_tokens is read up to `answer_tokens` (16 here: 128
    characters), and what it wrote to there is cut back as if it had stopped itself."""
    reply = cited(
        "Refunds are paid within 5 days [{n}].",
        "Refunds of orders paid by card go back to the card they were paid with, " * 3,
    )
    payload = ask(llm_app(FakeLlm(reply), answer_tokens=16), make_token(**ALICE))
    assert payload["degraded"] == [] and payload["answer"] == "Refunds are paid within 5 days [1]."
    assert payload["truncated"] is True


@pytest.mark.parametrize(
    ("reply", "answer"),
    [
        ("Refunds take 5 days. [{n}] Cards are refunded to", "Refunds take 5 days. [1]"),
        (
            "Refunds, e.g. by card [{n}], take 5 days [{n}]. Cards",
            "Refunds, e.g. by card [1], take 5 days [1].",
        ),  # fmt: skip
        ("Refunds take 5.5 days [{n}]!", "Refunds take 5.5 days [1]!"),
        ('He said "refunds take 5 days." [{n}] Then', 'He said "refunds take 5 days." [1]'),
        # A list's items end at their line breaks; an item's number ends nothing.
        (
            "Rules:\n- Refunds take 5 days [{n}]\n- Cards are refunded [{n}]\n- Cash is",
            "Rules:\n- Refunds take 5 days [1]\n- Cards are refunded [1]",
        ),
        (
            "Rules:\n1. Refunds take 5 days [{n}]\n2. Cards are refunded [{n}]\n3.",
            "Rules:\n1. Refunds take 5 days [1]\n2. Cards are refunded [1]",
        ),
        ("Refunds take 5 days [{n}] and\ncards are", None),  # a wrapped line ends nothing
        ("返金は5日以内です[{n}]。カードは", "返金は5日以内です [1]。"),
    ],
)
def test_where_a_cut_answer_s_sentences_end(
    llm_app: Callable[..., TestClient], make_token: TokenFactory, reply: str, answer: str | None
) -> None:
    """A marker written after the stop belongs to the sentence before it; a stop followed
    by a lower-case word ("e.g. by") or by no space ("5.5") ends none. A list cut at its
    bound was dropped whole (none of its items ends in a stop) or kept the number of the
    item cut ("3."). None: no whole cited sentence, so the extractive answer serves."""
    payload = ask(llm_app(FakeLlm(cited(reply), finish="length")), make_token(**ALICE))
    if answer is None:
        assert payload["degraded"] == ["llm"]
    else:
        assert payload["degraded"] == [] and payload["answer"] == answer


@contextmanager
def served(app: FastAPI) -> Iterator[str]:
    """`app` served by uvicorn on a loopback port, on uvloop as `gateway serve` runs it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(app, loop="uvloop", log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
        thread.start()
        try:
            while not server.started:
                assert thread.is_alive(), "the server did not start"
                time.sleep(0.01)
            yield f"http://127.0.0.1:{sock.getsockname()[1]}"
        finally:
            server.should_exit = True
            thread.join()


def test_one_slot_serves_every_door_one_request_after_another(
    data_dir: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory, tmp_path: Path
) -> None:
    """A door stops reading the answer's events at its outcome. Left to be finalised
    later, the events held their LLM slot past the response: with `max_concurrent: 1`,
    a client asking one question after another was refused `llm_busy` (on uvloop, as
    `gateway serve` runs, about one /v1 request in three). They are closed at once now."""
    policy = policy_dir(tmp_path, budgets=ROOMY, llm={"max_concurrent": 1})
    fake = FakeLlm(cited("Refunds are paid within 5 days [{n}]."))
    app = llm_app_of(fake, data_dir, jwks_file, embedder, policy)
    doors: list[tuple[str, dict[str, Any]]] = [
        ("/v1/chat/completions", {**CHAT, "stream": True}),
        ("/v1/chat/completions", CHAT),
        ("/answer", {"query": QUESTION, "stream": True}),
        ("/answer", {"query": QUESTION}),
    ]
    headers = bearer(make_token(**ALICE))
    refused = []
    with served(app) as base, httpx.Client(base_url=base, headers=headers, timeout=60) as client:
        for _ in range(10):
            for path, body in doors:
                response = client.post(path, json=body)
                if response.status_code != 200 or "llm_busy" in response.text:
                    refused.append((path, body.get("stream", False), response.status_code))
    assert refused == []
    assert len(fake.requests) == 40
