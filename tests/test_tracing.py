"""ID-only traces (invariant 9): real requests, real spans, scanned for any content at all."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import ValidationError
from typer.testing import CliRunner

from gateway import cli
from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.settings import Settings
from tests.helpers.identity import TokenFactory, make_settings
from tests.helpers.tracing import STAGES, exercise, forbidden_texts


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


def test_without_an_exporter_each_request_still_names_its_own_trace(
    data_dir: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    # No exporter (OTEL_TRACES_EXPORTER=none, the default): spans go nowhere, so none is
    # recorded, but responses and log lines still carry a fresh trace ID each.
    settings = make_settings(data_dir, jwks_file).model_copy(
        update={"otel_traces_exporter": "none"}
    )
    app = create_app(settings, embedder=embedder)
    with TestClient(app) as client:
        assert not app.state.gateway.tracing.exporting
        _answers, trace_ids = exercise(client, make_token)
    assert len(trace_ids) == len(set(trace_ids)) > 1
    assert all(len(t) == 32 and int(t, 16) != 0 for t in trace_ids)
