"""ID-only traces (invariant 9): real requests, real spans, scanned for any content at all."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import ValidationError
from typer.testing import CliRunner

from gateway import cli
from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.ingest.chunk import split_sentences
from gateway.settings import Settings
from tests.conftest import CORPUS, TokenFactory, bearer, make_settings
from tests.test_answer_api import STAGES
from tests.test_search_api import ALICE, BOB

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


@pytest.fixture(scope="module")
def traced(
    data_dir: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> tuple[list[ReadableSpan], list[str], list[str]]:
    exporter = InMemorySpanExporter()
    app = create_app(make_settings(data_dir, jwks_file), embedder=embedder, span_exporter=exporter)
    with TestClient(app) as client:
        answers, trace_ids = exercise(client, make_token)
    return list(exporter.get_finished_spans()), answers, trace_ids


def test_every_stage_is_a_child_of_one_request_span(
    traced: tuple[list[ReadableSpan], list[str], list[str]],
) -> None:
    spans, _answers, trace_ids = traced
    by_trace: dict[int, list[ReadableSpan]] = {}
    for span in spans:
        assert span.context is not None
        by_trace.setdefault(span.context.trace_id, []).append(span)
    assert {format(t, "032x") for t in by_trace} >= set(trace_ids)
    answer_trace = by_trace[int(trace_ids[1], 16)]
    streamed_trace = by_trace[int(trace_ids[-1], 16)]
    assert [s.name for s in streamed_trace if s.parent is None] == ["answer"]
    assert {s.name for s in streamed_trace if s.parent is not None} >= STAGES
    roots = [s for s in answer_trace if s.parent is None]
    assert [r.name for r in roots] == ["answer"]
    root = roots[0]
    assert root.context is not None
    stages = {s.name for s in answer_trace if s.parent is not None}
    assert stages >= STAGES
    assert all(
        s.parent is not None and s.parent.span_id == root.context.span_id
        for s in answer_trace
        if s is not root
    )
    attributes = dict(root.attributes or {})
    version = attributes["gateway.policy_version"]
    assert all(dict(s.attributes or {})["gateway.policy_version"] == version for s in answer_trace)
    assert attributes["gateway.subject"] == "alice"
    assert isinstance(attributes["gateway.policy_version"], str)
    assert isinstance(attributes["gateway.index_generation"], int)
    assert root.start_time is not None and root.end_time is not None
    assert all(root.start_time <= (s.start_time or 0) for s in answer_trace)


def test_spans_carry_ids_ranks_and_budgets(
    traced: tuple[list[ReadableSpan], list[str], list[str]],
) -> None:
    spans, _answers, _ids = traced
    bm25 = next(s for s in spans if s.name == "bm25")
    attributes = dict(bm25.attributes or {})
    assert attributes["budget_ms"] > 0 and attributes["hits"] >= 1
    assert all("@" in c for c in attributes["chunk_ids"])  # type: ignore[union-attr]
    assemble = next(s for s in spans if s.name == "assemble")
    assert "tokens" in (assemble.attributes or {})
    lookups = [s for s in spans if s.name in ("document", "chunk") and s.parent is None]
    assert {s.name for s in lookups} == {"document", "chunk"}
    # Alice's 404 for the merchant rule is traced as not found, like any missing ID.
    assert {dict(s.attributes or {})["gateway.found"] for s in lookups} == {True, False}


def test_no_span_carries_query_document_title_or_answer_text(
    traced: tuple[list[ReadableSpan], list[str], list[str]],
) -> None:
    spans, answers, _ids = traced
    assert any(answers), "some question should have been answered"
    exported = "\n".join(span.to_json() for span in spans)
    for text in forbidden_texts(answers):
        assert text not in exported, f"span content leaked: {text[:40]!r}"
    # Not even the restricted rule's code, which only the query named.
    assert "MRX-7781" not in exported


@pytest.mark.parametrize(
    ("value", "exporters"),
    [("none", set()), ("", set()), ("otlp", {"otlp"}), (" OTLP , console", {"otlp", "console"})],
)
def test_exporters_follow_otel_traces_exporter(
    monkeypatch: pytest.MonkeyPatch, value: str, exporters: set[str]
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", value)
    assert Settings().trace_exporters == exporters


def test_unknown_exporter_is_a_clear_startup_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp,jaeger")
    with pytest.raises(ValidationError, match="unknown exporter jaeger"):
        Settings()
    result = CliRunner().invoke(cli.app, ["serve"])
    assert result.exit_code == 1
    assert "invalid settings: OTEL_TRACES_EXPORTER" in result.output
