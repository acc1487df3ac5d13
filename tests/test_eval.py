"""`gateway eval`: BEIR files in, per-lane metrics and release gates out."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.cli import app as cli
from gateway.embedding import Embedder
from gateway.evaluation.beir import BenchmarkError, load_qrels, load_queries
from gateway.evaluation.metrics import ndcg_at, percentile, recall_at, reciprocal_rank
from gateway.ingest.pipeline import ingest_paths
from gateway.storage.layout import DataLayout
from tests.helpers.documents import write_corpus

PASSAGES = {
    "refund": ("Refund policy", "Refunds are paid within five days under rule RPL-14."),
    "remote": ("Flexible work", "Employees may work from their residence three days a week."),
    "fire": ("Fire safety", "Fire exits must stay clear of pallets and boxes at all times."),
    "cash": ("Cash handling", "Two employees count the till at the end of every shift."),
    "gift": ("Gift cards", "Gift cards never expire and can be used in any store."),
    "price": ("Price tags", "Price tags show the unit price of groceries sold by weight."),
}
QUERIES = {
    "q1": "how fast are refunds paid",
    "q2": "telecommuting allowance for staff",
    "q3": "RPL-14",
    "q4": "do gift cards expire",
    "q5": "not judged",
}
QRELS = [("q1", "refund", 1), ("q2", "remote", 2), ("q3", "refund", 1), ("q4", "gift", 1)]


@pytest.fixture(scope="module")
def beir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("beir")
    with (root / "corpus.jsonl").open("w") as out:
        for doc_id, (title, text) in PASSAGES.items():
            out.write(json.dumps({"_id": doc_id, "title": title, "text": text}) + "\n")
    with (root / "queries.jsonl").open("w") as out:
        for query_id, text in QUERIES.items():
            out.write(json.dumps({"_id": query_id, "text": text}) + "\n")
    lines = ["query-id\tcorpus-id\tscore", *(f"{q}\t{d}\t{s}" for q, d, s in QRELS)]
    (root / "qrels.tsv").write_text("\n".join(lines) + "\n")
    return root


def test_metrics_match_their_definitions() -> None:
    relevant = {"a": 2, "b": 1, "z": 0}
    assert ndcg_at(["a", "b"], relevant, 10) == 1.0
    swapped = (1 / math.log2(2) + 2 / math.log2(3)) / (2 / math.log2(2) + 1 / math.log2(3))
    assert ndcg_at(["b", "a"], relevant, 10) == pytest.approx(swapped)
    assert ndcg_at(["x", "z"], relevant, 10) == 0.0
    assert recall_at(["x", "a"], relevant, 1) == 0.0 and recall_at(["x", "a"], relevant, 2) == 0.5
    assert reciprocal_rank(["x", "y", "b"], relevant) == pytest.approx(1 / 3)
    assert reciprocal_rank(["x"] * 10 + ["a"], relevant, 10) == 0.0
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0 and percentile([1.0, 9.0], 95) == 9.0


@pytest.mark.model  # the CLI loads the model itself
def test_eval_reports_every_lane_as_table_and_json(beir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    args = [
        "eval",
        "--corpus",
        str(beir / "corpus.jsonl"),
        "--queries",
        str(beir / "queries.jsonl"),
    ]
    args += ["--qrels", str(beir / "qrels.tsv"), "--json", str(out), "--tenant", "acme"]
    args += ["--region", "EU", "--acl", "group:staff", "--data-dir", str(tmp_path / "idx")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "nDCG@10" in result.output and "fused" in result.output
    report = json.loads(out.read_text())
    assert report["queries"] == 4 and report["documents"] == 6  # q5 has no judgement
    # The policy's rows, then every other way of ranking documents.
    assert set(report["lanes"]) == {
        "bm25",
        "dense",
        "fused",
        "fused, document_ranking decayed_sum",
        "fused, document_ranking rrf_sum",
        "fused, document_ranking layered",
        "fused, document_fusion rrf",
        "fused, document_fusion layered",
        "fused, no document_bm25",
        "fused, no document_bm25 + document_vector mean",
        "fused, no document_bm25 + document_vector first",
        "fused, document_vector mean",
        "fused, document_vector first",
        "bm25, no document_bm25",
        "dense, document_vector mean",
        "dense, document_vector first",
        "fused, document_fusion rrf + no document_bm25",  # the earlier default
    }
    assert report["document_ranking"] == "best_chunk" and report["document_bm25"] is True
    assert report["document_vector"] == "off" and report["document_fusion"] == "weighted"
    for row, scores in report["lanes"].items():  # every mode with dense finds them all
        assert scores["recall_100"] == (0.75 if row.startswith("bm25") else 1.0), row
    fused = report["lanes"]["fused"]
    assert fused["recall_100"] == 1.0 and fused["ndcg_10"] > 0.8
    assert report["lanes"]["dense"]["recall_10"] == 1.0  # a paraphrase and a code alike
    assert 0 < report["latency_ms"]["p50"] <= report["latency_ms"]["p95"]
    # A second run reuses the index it built (the marker names the corpus and its scope).
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0 and "embedding" not in again.output
    # An index of an earlier release has no whole documents: its rows would be chunk rows.
    for partition in (tmp_path / "idx" / "lexical").glob("g*/d-*"):
        if partition.is_dir():  # (its digest file may stay: it names no partition)
            shutil.rmtree(partition)
    outdated = CliRunner().invoke(cli, args)
    assert outdated.exit_code == 1 and "another --data-dir" in outdated.output


@pytest.mark.model  # the CLI loads the model itself
def test_release_gate_cases_pass_and_fail(beir: Path, tmp_path: Path) -> None:
    data_dir = tmp_path / "idx"
    ingest = ["eval", "--corpus", str(beir / "corpus.jsonl"), "--queries"]
    ingest += [str(beir / "queries.jsonl"), "--qrels", str(beir / "qrels.tsv")]
    ingest += ["--tenant", "acme", "--region", "EU", "--acl", "group:staff"]
    assert CliRunner().invoke(cli, [*ingest, "--data-dir", str(data_dir)]).exit_code == 0
    staff = {"sub": "ann", "tenant": "acme", "region": "EU", "groups": ["staff"]}
    outsider = {"sub": "bob", "tenant": "acme", "region": "US", "groups": ["staff"]}
    cases = tmp_path / "cases.yaml"
    cases.write_text(
        json.dumps(
            {
                "cases": [
                    {
                        "name": "code",
                        "caller": staff,
                        "query": "RPL-14",
                        "top_k": 1,
                        "must": ["refund", "refund@1:0"],
                    },
                    {
                        "name": "other region",
                        "caller": outsider,
                        "query": "RPL-14",
                        "must_not": ["refund"],
                    },
                    {
                        "name": "wrong",
                        "caller": staff,
                        "query": "fire exits",
                        "top_k": 1,
                        "must": ["gift"],
                        "must_not": ["fire"],
                    },
                ]
            }
        )
    )
    result = CliRunner().invoke(cli, ["eval", "--cases", str(cases), "--data-dir", str(data_dir)])
    assert result.exit_code == 1
    assert "PASS  code" in result.output and "PASS  other region" in result.output
    assert "FAIL  wrong: missing gift; must not appear but did: fire" in result.output
    assert "2 of 3 cases passed" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--corpus", "c.jsonl"], "go together"),
        ([], "nothing to do"),
        (["--cases", "x.yaml"], "needs the --data-dir"),
    ],
)
def test_eval_refuses_incomplete_requests(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["eval", *args])
    assert result.exit_code == 1 and message in result.output


def test_a_corpus_is_never_ingested_into_a_data_dir_eval_did_not_make(
    beir: Path, tmp_path: Path, embedder: Embedder
) -> None:
    """`--data-dir` of a deployment's data dir ingested the benchmark into it, beside the
    documents its server serves. Refused before the model loads; nothing is written."""
    served = DataLayout(tmp_path / "data")
    ingest_paths([write_corpus(tmp_path / "corpus")], served, embedder)
    catalog = served.open_catalog()
    before = (catalog.current_generation_id(), sorted(p.name for p in served.root.iterdir()))
    keys_only = DataLayout(tmp_path / "keys-only")  # a catalog before its first ingest
    keys_only.open_catalog()
    benchmark = ["--corpus", str(beir / "corpus.jsonl"), "--queries", str(beir / "queries.jsonl")]
    benchmark += ["--qrels", str(beir / "qrels.tsv")]
    for layout in (served, keys_only):
        result = CliRunner().invoke(cli, ["eval", *benchmark, "--data-dir", str(layout.root)])
        assert result.exit_code == 1, result.output
        assert f"{layout.root} holds a catalog or index that `gateway eval` did not make" in (
            result.output
        )
    after = (catalog.current_generation_id(), sorted(p.name for p in served.root.iterdir()))
    assert after == before  # no generation, no marker, no model cache
    assert catalog.tenant_counts("eval") == (0, 0, 0)


def test_bad_benchmark_files_name_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "q.jsonl").write_text('{"_id": "1", "text": "fine"}\n{"_id": "2"}\n')
    with pytest.raises(BenchmarkError, match=r"q.jsonl:2: missing text or question or query"):
        load_queries(tmp_path / "q.jsonl")
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\tmany\n")
    with pytest.raises(BenchmarkError, match=r"qrels.tsv:2: score 'many' is not an integer"):
        load_qrels(tmp_path / "qrels.tsv")


@pytest.mark.model  # the CLI loads the model itself
def test_eval_answers_scores_answerable_unanswerable_and_off_corpus(
    beir: Path, tmp_path: Path
) -> None:
    questions = [
        # answerable: the refund passage holds "five days"
        {"id": "a1", "question": "How fast are refunds paid?", "answers": ["five days"],
         "is_impossible": False, "gold_passage_id": "refund"},
        {"id": "a2", "question": "Do gift cards expire?", "answers": ["never expire"],
         "is_impossible": False, "gold_passage_id": "gift"},
        # unanswerable, against a passage of the corpus
        {"id": "u1", "question": "Who signs the refund cheques?", "answers": [],
         "is_impossible": True, "gold_passage_id": "refund"},
        # off-corpus: its passage is not in the corpus
        {"id": "o1", "question": "What is the boiling point of liquid nitrogen?",
         "answers": ["-196 C"], "is_impossible": False, "gold_passage_id": "chemistry"},
    ]  # fmt: skip
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in questions))
    out = tmp_path / "answers.json"
    args = ["eval", "--corpus", str(beir / "corpus.jsonl"), "--answers", str(path)]
    args += ["--json", str(out), "--data-dir", str(tmp_path / "idx")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "gold paragraph cited" in result.output and "SQuAD F1" in result.output
    report = json.loads(out.read_text())
    assert report["questions"] == {"answerable": 2, "unanswerable": 1, "off-corpus": 1}
    assert report["answered"] == 1.0 and report["gold_cited"] == 1.0
    assert report["gold_contained"] == 1.0 and 0 < report["squad_f1"] <= 1.0
    assert report["off_corpus_abstained"] == 1.0
    assert report["uncited_answers"] == 0
    assert report["reasons"].get("insufficient_evidence", 0) >= 1


def test_squad_f1_and_normalisation() -> None:
    from gateway.evaluation.answers import normalise, squad_f1

    assert normalise("The Normans [1], of France!") == "normans of france"
    assert squad_f1("in the 10th century [2]", ["10th century"]) == pytest.approx(0.8)
    assert squad_f1("France", ["Paris", "France"]) == 1.0
    assert squad_f1("nothing shared", ["France"]) == 0.0
