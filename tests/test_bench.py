"""`gateway bench`: the synthetic corpus it builds, and the whole command run for real."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from gateway.bench import synthetic
from gateway.bench.runner import MANIFEST, BenchOptions, _recipe, _source
from gateway.cli import app as cli
from gateway.domain import Visibility
from gateway.embedding import Embedder
from gateway.ingest.chunk import split_sentences
from gateway.restriction import Restriction

pytestmark = [pytest.mark.server, pytest.mark.long]

STAGES = {"authenticate", "resolve", "restrict", "embed_query", "bm25", "dense", "fuse"}
ANSWER_STAGES = {"expand", "assemble", "answer"}
TODAY = dt.date(2026, 6, 1)


def sees(caller: Restriction, v: Visibility) -> bool:
    return (
        v.tenant == caller.tenant
        and v.region in caller.regions
        and bool(caller.principals & set(v.acl))
        and v.effective_from <= caller.as_of
        and (v.effective_to is None or caller.as_of <= v.effective_to)
    )


def caller(selectivity: float) -> Restriction:
    groups = frozenset(f"group:{g}" for g in synthetic.caller_groups(selectivity))
    return Restriction(synthetic.TENANT, groups, frozenset({synthetic.REGION}), TODAY)


@pytest.mark.parametrize("selectivity", [0.01, 0.1, 1.0])
def test_a_caller_sees_the_share_asked_for_and_decoys_need_the_other_filters(
    selectivity: float,
) -> None:
    rng = np.random.default_rng(7)
    documents = [synthetic.draw_visibility(rng) for _ in range(40_000)]
    share = sum(sees(caller(selectivity), v) for v in documents) / len(documents)
    decoys = [v for v in documents if v.acl[0] == "group:bench-0001" and not sees(caller(1), v)]
    expected = selectivity if selectivity < 1 else 1 - len(decoys) / len(documents)
    assert share == pytest.approx(expected, rel=0.15)
    # Decoys carry a group every caller holds: only tenant, region or dates keep them out.
    assert 0.1 < len(decoys) / len(documents) < 0.2
    kinds = {
        "tenant": any(v.tenant != synthetic.TENANT for v in decoys),
        "region": any(v.region != synthetic.REGION for v in decoys),
        "expired": any(v.effective_to is not None for v in decoys),
        "future": any(v.effective_from > TODAY for v in decoys),
    }
    assert all(kinds.values()), kinds


def test_chunks_join_two_real_sentences_around_their_embeddings() -> None:
    base = synthetic.sentences(300)
    assert len({s.text for s in base}) == 300
    assert all(s.question.endswith("?") for s in base)
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(300, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    tokens = [len(s.text.split()) for s in base]
    batches = list(synthetic.batches(1001, base, vectors, tokens, batch_chunks=400))
    chunks = [c for b in batches for c in b.encoded.chunks]
    assert len(chunks) == 1001 and len(batches) == 3
    texts = {s.text: i for i, s in enumerate(base)}
    for batch in batches:
        for chunk, vector in zip(batch.encoded.chunks, batch.encoded.vectors, strict=True):
            first, second = split_sentences(chunk.text)  # two sentences, as stored
            mix = vectors[texts[first]], vectors[texts[second]]
            # The vector lies near its sentences' embeddings, not anywhere at random.
            assert max(float(vector @ m) for m in mix) > 0.6
            assert chunk.scoped_id in batch.encoded.sentence_vectors
            assert chunk.token_count == tokens[texts[first]] + tokens[texts[second]]


def test_bench_runs_the_real_server_and_reports_every_field(tmp_path: Path) -> None:
    data, out = tmp_path / "bench", tmp_path / "report.json"
    # A corpus small enough to build in seconds at which every field still means something
    # (25 chunks visible at 10%, more than the 10 that recall@10 compares): the numbers
    # belong to the benchmark, the test checks that it runs a real server end to end and
    # reports them.
    command = [sys.executable, "-m", "gateway", "bench", "--chunks", "250", "--queries", "10"]
    command += ["--selectivity", "0.1", "--data-dir", str(data), "--json", str(out)]
    first = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    report = json.loads(out.read_text())
    assert {
        "chunks", "queries", "concurrency", "selectivity", "synthetic", "search_ms",
        "answer_ms", "stages_ms", "qps", "errors", "degraded", "dense_recall_at_10",
        "rss_mb", "startup_s", "ingest_chunks_per_s", "ingest_tokens_per_s",
    } <= set(report)  # fmt: skip
    assert report["chunks"] == 250 and report["queries"] == 10 and report["synthetic"]
    assert report["errors"] == 0 and report["degraded"] == 0 and report["failures"] == {}
    assert report["visible_share"] == pytest.approx(0.1, abs=0.05)
    assert report["dense_recall_at_10"] == 1.0  # exact in memory at this size
    assert set(report["stages_ms"]) >= STAGES | ANSWER_STAGES
    for name in ("search_ms", "search_by_document_ms", "answer_ms"):
        q = report[name]
        assert 0 < q["p50"] <= q["p95"] <= q["p99"]
    assert "bm25_documents" in report["stages_by_document_ms"]  # whole documents were ranked
    assert "bm25_documents" not in report["stages_ms"]
    assert report["qps"] > 0 and report["rss_mb"] > 100 and report["startup_s"] > 0
    # Each search costs the server CPU: embedding alone is milliseconds.
    assert report["search_server_cpu_ms"] > 1
    assert report["ingest_chunks_per_s"] > 0 and report["ingest_tokens_per_s"] > 0
    assert "search_ms" in first.stdout and "dense recall@10" in first.stdout
    assert "search_by_document_ms" in first.stdout

    # `auto`, the default: one process, so split where it may use exactly two CPUs.
    placed = "split" if len(os.sched_getaffinity(0)) == 2 else "shared"
    assert report["server_processes"] == 1 and report["lane_cpus"] == placed

    # A second run reuses the corpus, served from two processes: each loads the model and
    # maps the index, so the served tree holds about twice the memory of one process.
    # A data dir of another index is refused untouched.
    again = subprocess.run(
        [*command, "--processes", "2"], capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 0 and "reusing the corpus" in again.stdout
    second = json.loads(out.read_text())
    assert second["build_s"] is None and second["errors"] == 0
    assert second["server_processes"] == 2 and "serving processes 2" in again.stdout
    assert second["lane_cpus"] == "shared"  # `auto`: a group's processes never split
    assert second["rss_mb"] > 1.5 * report["rss_mb"]
    # Summed resident memory counts the pages the processes share once in each; their
    # proportional share counts each page once.
    assert 0 < report["pss_end_mb"] <= report["rss_end_mb"]
    assert report["pss_end_mb"] < second["pss_end_mb"] < second["rss_end_mb"]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "catalog.db").write_bytes(b"")
    refused = subprocess.run(
        [*command[:-4], "--data-dir", str(foreign)], capture_output=True, text=True
    )
    assert refused.returncode == 1 and "did not build" in refused.stderr
    assert (foreign / "catalog.db").exists()


def bench_in_process(*args: str) -> Result:
    return CliRunner().invoke(cli, ["bench", "--queries", "5", *args])


def test_bench_names_the_problems_of_a_refused_corpus(tmp_path: Path) -> None:
    """A document missing its metadata ended the run in a traceback that said only
    `DocumentsRefused (message withheld)`."""
    bad = tmp_path / "bad.jsonl"
    record = {"doc_id": "x", "tenant": "acme", "text": "A sentence of more than six words here."}
    bad.write_text(json.dumps(record) + "\n")
    result = bench_in_process("--corpus", str(bad), "--data-dir", str(tmp_path / "bench"))
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert f"bench: refused, nothing was ingested:\n{bad}:1: region: required" in result.output
    assert not (tmp_path / "bench").exists()


def test_bench_refuses_a_corpus_with_no_sentence_to_ask_before_building(tmp_path: Path) -> None:
    """Queries are a document's first sentence of six words or more: without one, the
    corpus was ingested, the run ended in a ZeroDivisionError, and the manifest it left,
    with no queries, was reused by the next run."""
    short = tmp_path / "short.jsonl"
    visibility = {"tenant": "acme", "region": "EU", "acl": ["group:staff"]}
    short.write_text(
        "".join(
            json.dumps({"doc_id": f"d{n}", "text": "Short text. Tiny.", **visibility,
                        "effective_from": "2020-01-01"}) + "\n"
            for n in range(3)
        )
    )  # fmt: skip
    data = tmp_path / "bench"
    refused = "no document has a sentence of six words or more to ask as a query"
    result = bench_in_process("--corpus", str(short), "--data-dir", str(data))
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert f"bench: {short}: {refused}; nothing was ingested" in result.output
    assert not data.exists()
    # The manifest an earlier release left for this corpus: its recipe, no queries.
    options = BenchOptions(corpus=short)
    manifest = data / MANIFEST
    manifest.parent.mkdir(parents=True)
    recipe = _recipe(options, _source(options), Embedder())
    manifest.write_text(json.dumps({"recipe": recipe, "queries": [], "build_s": 1.0}))
    again = bench_in_process("--corpus", str(short), "--data-dir", str(data))
    assert again.exit_code == 1 and isinstance(again.exception, SystemExit), again.output
    assert "reusing the corpus" not in again.output and refused in again.output
    assert not manifest.exists()
