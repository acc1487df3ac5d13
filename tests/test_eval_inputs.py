"""`gateway eval` reads and checks every input file before it loads the model or writes
anything: a bad or degenerate file is refused, named with its line, exit 1. And what it
reads is scored as written: an untitled passage is not titled with its `_id`, SQuAD's own
answer objects are gold answers, and `is_impossible` is a boolean."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gateway.cli import app as cli
from gateway.evaluation.retrieval import FINGERPRINT_FILE, Scope

CORPUS = [
    {"_id": "refund", "title": "Refunds", "text": "Refunds are paid within five days."},
    {"_id": "gift", "title": "Gift cards", "text": "Gift cards never expire in any store."},
]
QUERIES = [{"_id": "q1", "text": "how fast are refunds paid"}, {"_id": "q2", "text": "gift"}]
QRELS = "query-id\tcorpus-id\tscore\nq1\trefund\t1\nq2\tgift\t1\n"
QUESTION = {
    "id": "a1",
    "question": "How fast are refunds paid?",
    "answers": ["five days"],
    "is_impossible": False,
    "gold_passage_id": "refund",
}


def jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def given(tmp_path: Path) -> dict[str, Path]:
    """A well-formed benchmark, questions file and cases file; each test spoils one."""
    (tmp_path / "qrels.tsv").write_text(QRELS)
    (tmp_path / "cases.yaml").write_text("cases:\n  - {name: a, caller: {}, query: refunds}\n")
    return {
        "corpus": jsonl(tmp_path / "corpus.jsonl", CORPUS),
        "queries": jsonl(tmp_path / "queries.jsonl", QUERIES),
        "qrels": tmp_path / "qrels.tsv",
        "answers": jsonl(tmp_path / "questions.jsonl", [QUESTION]),
        "cases": tmp_path / "cases.yaml",
    }


def retrieval(given: dict[str, Path]) -> list[str]:
    return [f"--{name}={given[name]}" for name in ("corpus", "queries", "qrels")]


def eval_run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["eval", *args])
    return result.exit_code, result.output


def test_a_corpus_or_query_id_given_twice_is_refused_with_both_lines(
    given: dict[str, Path], tmp_path: Path
) -> None:
    """The catalog refused a corpus `_id` given twice after the model had loaded
    (SQLITE_CONSTRAINT_PRIMARYKEY, no line); a query `_id` twice was scored twice."""
    jsonl(given["corpus"], [*CORPUS, {"_id": "refund", "text": "Another text."}])
    code, output = eval_run(*retrieval(given), f"--data-dir={tmp_path / 'idx'}")
    assert code == 1 and f"{given['corpus']}:3: ID 'refund' again (first on line 1)" in output
    jsonl(given["corpus"], CORPUS)
    jsonl(given["queries"], [*QUERIES, {"_id": "q1", "text": "refund timing"}])
    code, output = eval_run(*retrieval(given), f"--data-dir={tmp_path / 'idx'}")
    assert code == 1 and f"{given['queries']}:3: ID 'q1' again (first on line 1)" in output
    assert not (tmp_path / "idx").exists()  # refused before anything was written


@pytest.mark.parametrize("queries", [QUERIES, []], ids=["judged-elsewhere", "no-queries"])
def test_qrels_that_judge_no_query_are_refused_before_the_model_loads(
    given: dict[str, Path], tmp_path: Path, queries: list[dict[str, Any]]
) -> None:
    """Every lane ran, then the report ended in a KeyError traceback."""
    jsonl(given["queries"], queries)
    given["qrels"].write_text("query-id\tcorpus-id\tscore\nother\trefund\t1\nq1\tgift\t0\n")
    code, output = eval_run(*retrieval(given), f"--data-dir={tmp_path / 'idx'}")
    assert code == 1
    assert f"no query of {given['queries']} has a positive judgement in {given['qrels']}" in (
        output
    )
    assert not (tmp_path / "idx").exists()


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("corpus", b"", "corpus.jsonl: no documents"),
        ("corpus", b'{"_id": "a", "text": "ok"}\n{"_id": "b", "text": "caf\xe9"}\n',
         "corpus.jsonl:2: not UTF-8 text (byte 0xe9): save it as UTF-8"),
        ("queries", b'{"_id": "q1", "text": "caf\xe9"}\n', "queries.jsonl:1: not UTF-8 text"),
        ("qrels", b"query-id\tcorpus-id\tscore\nq1\trefund\nq2\tgift\t1\n",
         "qrels.tsv:2: expected query-id, corpus-id, score"),
        ("qrels", b"q1\trefund\t1\nq\xe92\tgift\t1\n", "qrels.tsv:2: not UTF-8 text"),
        ("cases", b"cases:\n  - name: caf\xe9\n", "cases.yaml:2: not UTF-8 text"),
    ],
    ids=["empty-corpus", "latin1-corpus", "latin1-queries", "short-qrels", "latin1-qrels",
         "latin1-cases"],
)  # fmt: skip
def test_a_bad_file_is_refused_naming_file_and_line_before_anything_is_written(
    given: dict[str, Path], tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    """The qrels were read after the whole corpus was embedded; a file not in UTF-8 said
    only "'utf-8' codec can't decode ..."; an empty corpus ended in an AssertionError."""
    given[name].write_bytes(content)
    code, output = eval_run(
        *retrieval(given), f"--cases={given['cases']}", f"--data-dir={tmp_path / 'idx'}"
    )
    assert code == 1 and f"{given[name].parent}/{message}" in output, output
    assert "Traceback" not in output and not (tmp_path / "idx").exists()


@pytest.mark.parametrize(
    ("question", "message"),
    [
        ({**QUESTION, "is_impossible": "false"}, "is_impossible must be true or false, not "
         "'false'"),
        ({**QUESTION, "answers": [{"answer_start": 3}]}, "answers must be a list of strings, "
         "or of SQuAD answer objects"),
        ({**QUESTION, "answers": [5]}, "answers must be a list of strings"),
    ],
    ids=["string-boolean", "object-without-text", "number"],
)  # fmt: skip
def test_answers_refuse_what_they_would_score_wrongly(
    given: dict[str, Path], tmp_path: Path, question: dict[str, Any], message: str
) -> None:
    """The string "false" counted as true (every question unanswerable), and an answer
    that was no string was scored as its repr; both reported with exit 0."""
    jsonl(given["answers"], [QUESTION, question])
    code, output = eval_run(
        f"--corpus={given['corpus']}", f"--answers={given['answers']}",
        f"--data-dir={tmp_path / 'idx'}",
    )  # fmt: skip
    assert code == 1 and f"{given['answers']}:2: {message}" in output, output
    assert not (tmp_path / "idx").exists()


def test_queries_without_qrels_are_refused_whatever_else_is_given(
    given: dict[str, Path],
) -> None:
    """`--corpus --answers --queries` scored the answers and dropped `--queries` silently."""
    answers = [f"--corpus={given['corpus']}", f"--answers={given['answers']}"]
    for extra in (f"--queries={given['queries']}", f"--qrels={given['qrels']}"):
        code, output = eval_run(*answers, extra)
        assert code == 1 and "--corpus, --queries and --qrels go together" in output


def test_cases_on_a_mistyped_data_dir_create_nothing_there(
    given: dict[str, Path], tmp_path: Path
) -> None:
    """It said "no index in DIR", but left a catalog, a migrate lock and the model's export
    there, and a `--corpus` run into that path was then refused as another's data dir."""
    mistyped = tmp_path / "idxx"
    code, output = eval_run(f"--cases={given['cases']}", f"--data-dir={mistyped}")
    assert code == 1 and f"no index in {mistyped}" in output
    assert not mistyped.exists()


@pytest.mark.model  # the CLI loads the model itself
def test_answers_accept_squad_answer_objects(given: dict[str, Path], tmp_path: Path) -> None:
    """SQuAD writes `answers` as objects; each was scored as the text of its repr, so no
    answer contained a gold answer."""
    squad = {**QUESTION, "answers": [{"text": "five days", "answer_start": 22}]}
    jsonl(given["answers"], [squad])
    out = tmp_path / "answers.json"
    code, output = eval_run(
        f"--corpus={given['corpus']}", f"--answers={given['answers']}", f"--json={out}",
        f"--data-dir={tmp_path / 'idx'}",
    )  # fmt: skip
    assert code == 0, output
    report = json.loads(out.read_text())
    assert report["answered"] == 1.0 and report["gold_contained"] == 1.0
    assert report["squad_f1"] > 0


# Untitled passages (MS MARCO, FiQA, Quora have no titles): the refund passage is called
# "walrus", and the query "walrus" is about the other.
UNTITLED = [
    {"_id": "walrus", "title": "", "text": "Refunds are paid to the original card in five days."},
    {"_id": "d2", "text": "Walrus colonies haul out on Arctic ice floes in summer to moult."},
    {"_id": "d3", "text": "Fire exits must stay clear of boxes at all times."},
]


def untitled_benchmark(tmp_path: Path) -> list[str]:
    corpus = jsonl(tmp_path / "untitled.jsonl", UNTITLED)
    queries = jsonl(tmp_path / "walrus.jsonl", [{"_id": "q", "text": "walrus"}])
    (tmp_path / "walrus.tsv").write_text("q\td2\t1\n")
    return [f"--corpus={corpus}", f"--queries={queries}", f"--qrels={tmp_path / 'walrus.tsv'}"]


def ndcg(tmp_path: Path, *args: str) -> dict[str, float]:
    out = tmp_path / "report.json"
    code, output = eval_run(*args, f"--json={out}")
    assert code == 0, output
    lanes = json.loads(out.read_text())["lanes"]
    return {lane: lanes[lane]["ndcg_10"] for lane in ("bm25", "dense", "fused")}


@pytest.mark.model  # the CLI loads the model itself
def test_an_untitled_passage_is_not_titled_with_its_id(tmp_path: Path) -> None:
    """Its `_id` was embedded and BM25-indexed as its title: the refund passage named
    "walrus" came first for "walrus" (nDCG@10 0.63; renamed, 1.0)."""
    scores = ndcg(tmp_path, *untitled_benchmark(tmp_path), f"--data-dir={tmp_path / 'idx'}")
    assert scores == {"bm25": 1.0, "dense": 1.0, "fused": 1.0}


@pytest.mark.model  # the CLI loads the model itself
def test_a_data_dir_of_id_titles_is_ingested_again(tmp_path: Path) -> None:
    """A data dir that an earlier release built holds the IDs as titles, under a marker
    that matched the same untitled corpus: reused, it kept scoring the names."""
    data_dir = tmp_path / "idx"
    benchmark = untitled_benchmark(tmp_path)
    # What the earlier release ingested for the untitled corpus: every _id as its title.
    titled = jsonl(tmp_path / "titled.jsonl", [{**p, "title": p["_id"]} for p in UNTITLED])
    scores = ndcg(tmp_path, f"--corpus={titled}", *benchmark[1:], f"--data-dir={data_dir}")
    assert scores["bm25"] < 1.0  # the name "walrus" outranks the walrus passage
    # ... under the marker it wrote for the untitled corpus: the scope, then each passage.
    earlier = hashlib.sha256(repr(Scope()).encode())
    for p in UNTITLED:
        earlier.update(f"{p['_id']}\0\0{p['text']}\0".encode())
    marker = data_dir / FINGERPRINT_FILE
    recipe = marker.read_text().split()[1]
    marker.write_text(f"{earlier.hexdigest()}\n{recipe}\n")

    scores = ndcg(tmp_path, *benchmark, f"--data-dir={data_dir}")
    assert scores == {"bm25": 1.0, "dense": 1.0, "fused": 1.0}
