"""`gateway eval` and `gateway bench` reuse the index they built only while its vectors are
of the numerics asked for: a float32 run after a bfloat16 one in the same data dir scored
the bfloat16 passages, silently, and that is how the quality guard is checked
(docs/evaluation.md, "Embedding precision")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.bench.runner import BenchOptions, _corpus, _source
from gateway.cli import app as cli
from gateway.embedding import Embedder
from gateway.embedding.precision import PrecisionSetting
from gateway.policy.loader import load_policy
from gateway.storage.layout import DataLayout
from tests.helpers.documents import big_batch

PASSAGES = {
    "refund": ("Refund policy", "Refunds are paid within five days under rule RPL-14."),
    "remote": ("Flexible work", "Employees may work from their residence three days a week."),
    "gift": ("Gift cards", "Gift cards never expire and can be used in any store."),
}


@pytest.fixture
def beir(tmp_path: Path) -> list[str]:
    """The arguments of a small `gateway eval --corpus --queries --qrels` run."""
    with (tmp_path / "corpus.jsonl").open("w") as out:
        for doc_id, (title, body) in PASSAGES.items():
            out.write(json.dumps({"_id": doc_id, "title": title, "text": body}) + "\n")
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "q", "text": "RPL-14"}) + "\n")
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq\trefund\t1\n")
    return [
        "eval",
        *("--corpus", str(tmp_path / "corpus.jsonl")),
        *("--queries", str(tmp_path / "queries.jsonl")),
        *("--qrels", str(tmp_path / "qrels.tsv")),
    ]


@pytest.mark.model  # the CLI loads the model itself
def test_eval_embeds_the_corpus_again_in_other_numerics(
    beir: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = DataLayout(tmp_path / "idx")
    report = tmp_path / "report.json"
    args = [*beir, "--data-dir", str(layout.root), "--json", str(report)]

    def run(precision: str) -> str:
        monkeypatch.setenv("GATEWAY_EMBEDDING_PRECISION", precision)
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        return result.output

    first = run("bfloat16")
    assert "index generation 1: passages embedded in bfloat16, queries in " in first

    second = run("float32")  # the same corpus and data dir, other numerics: embedded again
    assert "index generation 2: passages embedded in float32, queries in float32" in second
    assert numerics_of(layout) == "float32"
    assert json.loads(report.read_text())["passage_numerics"] == "float32"

    third = run("float32")  # the same numerics again: reused, nothing embedded
    assert "index generation 2: passages embedded in float32" in third
    assert layout.open_catalog().current_generation_id() == 2


@pytest.mark.model
def test_bench_builds_its_corpus_again_in_other_numerics(
    tmp_path: Path, embedder: Embedder
) -> None:
    options = BenchOptions(corpus=big_batch(tmp_path / "corpus.jsonl", 3, short=True))
    layout = DataLayout(tmp_path / "bench")
    policy = load_policy(None).policy
    said: list[str] = []

    def build(precision: PrecisionSetting) -> float | None:
        model = Embedder(embedder.model_dir, precision=precision)
        built_s, _ = _corpus(layout, options, _source(options), policy, model, said.append)
        return built_s

    assert build("bfloat16") is not None
    assert numerics_of(layout) == "bfloat16"
    assert build("float32") is not None  # not "reusing the corpus" of bfloat16 vectors
    assert numerics_of(layout) == "float32"
    assert build("float32") is None and said[-1] == f"reusing the corpus in {layout.root}"


def numerics_of(layout: DataLayout) -> str:
    """What the served generation records of its vectors' numerics."""
    current = layout.open_catalog().current_generation()
    assert current is not None
    return current.precisions
