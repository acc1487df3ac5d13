"""What `gateway eval` does, apart from parsing its options (in `gateway.cli.evaluate`):
check that the options go together, read and check every input file (before the model
loads or anything is written), index the corpus (or open the index in `--data-dir`;
a corpus is indexed only into a data dir that eval made or a new one),
then score retrieval (`retrieval.py`), answers (`answers.py`) and the release-gate cases
(`cases.py`), whichever were asked for."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.answer.llm import LlmAnswerer
from gateway.answer.pipeline import AnswerPipeline
from gateway.embedding import Embedder
from gateway.embedding.onnx_query import enable_fast_queries
from gateway.embedding.precision import PrecisionSetting
from gateway.evaluation.answers import (
    AnswerQuestion,
    AnswerReport,
    evaluate_answers,
    load_answer_questions,
)
from gateway.evaluation.beir import (
    BenchmarkError,
    Passage,
    Query,
    load_corpus,
    load_qrels,
    load_queries,
)
from gateway.evaluation.cases import Case, load_cases, run_cases
from gateway.evaluation.retrieval import (
    FINGERPRINT_FILE,
    Scope,
    claim_data_dir,
    evaluate,
    judged_queries,
    lane_sets,
    prepare_index,
)
from gateway.policy.loader import load_policy
from gateway.policy.model import Policy
from gateway.retrieval.search import HybridSearcher
from gateway.settings import Settings
from gateway.storage.catalog import Catalog
from gateway.storage.layout import DataLayout, ServedIndex, open_served


@dataclass(frozen=True)
class EvalOptions:
    corpus: Path | None
    queries: Path | None
    qrels: Path | None
    cases: Path | None
    scope: Scope
    data_dir: Path | None
    policy_dir: Path | None
    json_out: Path | None
    answers: Path | None = None
    precision: PrecisionSetting = "auto"
    model_cache_dir: Path | None = None  # the query encoder's export; <data dir>/models


@dataclass(frozen=True)
class Inputs:
    """Every input file, read and checked before the model loads or anything is written:
    a bad line in the last file read used to end a run that had embedded the corpus."""

    passages: list[Passage]
    queries: list[Query]
    qrels: dict[str, dict[str, int]]
    questions: list[AnswerQuestion]
    cases: list[Case]


def read_inputs(options: EvalOptions) -> Inputs:
    passages = load_corpus(options.corpus) if options.corpus else []
    queries = load_queries(options.queries) if options.queries else []
    qrels = load_qrels(options.qrels) if options.qrels else {}
    if options.queries and not judged_queries(queries, qrels):
        raise BenchmarkError(
            f"no query of {options.queries} has a positive judgement in {options.qrels}"
        )
    return Inputs(
        passages,
        queries,
        qrels,
        load_answer_questions(options.answers) if options.answers else [],
        load_cases(options.cases) if options.cases else [],
    )


def run_eval(options: EvalOptions, say: Callable[[str], None]) -> int:
    """0 when everything ran and every case passed, 1 otherwise."""
    benchmark = (options.corpus, options.queries, options.qrels)
    answers_alone = options.corpus and options.answers and not (options.queries or options.qrels)
    if any(benchmark) and not all(benchmark) and not answers_alone:
        say("--corpus, --queries and --qrels go together")
        return 1
    if options.answers and not options.corpus:
        say("--answers needs the --corpus its questions were written against")
        return 1
    if not options.corpus and not options.cases:
        say("nothing to do: give --corpus with --queries/--qrels or --answers, or --cases")
        return 1
    if not options.corpus and not options.data_dir:
        say("--cases without --corpus needs the --data-dir of an existing index")
        return 1
    inputs = read_inputs(options)
    scratch = None if options.data_dir else Path(tempfile.mkdtemp(prefix="gateway-eval-"))
    layout = DataLayout(options.data_dir or scratch or Path())
    if not options.corpus and not layout.catalog.is_file():
        # Opening it would make a catalog (and the model's export) in a mistyped path.
        say(f"no index in {layout.root}")
        return 1
    try:
        if options.corpus and not claim_data_dir(layout):  # before the model loads
            say(
                f"{layout.root} holds a catalog or index that `gateway eval` did not make (no "
                f"{FINGERPRINT_FILE}): eval would ingest its corpus into it. Give --corpus a "
                "new or empty --data-dir; --cases alone reads an index without writing"
            )
            return 1
        return _run(options, inputs, layout, say)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _run(
    options: EvalOptions, inputs: Inputs, layout: DataLayout, say: Callable[[str], None]
) -> int:
    policy = load_policy(options.policy_dir).policy
    embedder = Embedder(precision=options.precision)
    # as `gateway serve` embeds queries, and from the same cache
    enable_fast_queries(embedder, options.model_cache_dir or layout.root / "models")
    status = 0
    reports: dict[str, object] = {}
    if options.corpus:
        index = prepare_index(layout, inputs.passages, options.scope, embedder, policy)
        say(_numerics_header(index, embedder))
        if options.queries and options.qrels:
            report = evaluate(index, embedder, policy, options.scope, inputs.queries, inputs.qrels)
            say(report.table())
            reports["retrieval"] = dataclasses.asdict(report)
        if options.answers:
            ids = {p.doc_id for p in inputs.passages}
            catalog = layout.open_catalog()
            answered = _answers(
                inputs.questions, index, catalog, embedder, policy, options.scope, ids
            )
            say(answered.table())
            reports["answers"] = dataclasses.asdict(answered)
        if options.json_out:
            # One report alone is written as it is; both together are keyed by kind.
            written = next(iter(reports.values())) if len(reports) == 1 else reports
            options.json_out.write_text(json.dumps(written, indent=2) + "\n")
    else:
        index_or_none = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim)
        if index_or_none is None:
            say(f"no index in {layout.root}")
            return 1
        index = index_or_none
        say(_numerics_header(index, embedder))
    if options.cases:
        searcher = _fused_searcher(embedder, policy)
        try:
            results = run_cases(inputs.cases, index, searcher, policy)
        finally:
            searcher.close()
        for result in results:
            say(result.line())
        failed = sum(not r.passed for r in results)
        say(f"{len(results) - failed} of {len(results)} cases passed")
        status = 1 if failed else 0
    return status


def _numerics_header(index: ServedIndex, embedder: Embedder) -> str:
    """What every figure below depends on: the numerics of the vectors scored (the served
    generation's, whatever this run would embed in) and of the queries."""
    generation = index.generation
    return (
        f"index generation {generation.id}: passages embedded in {generation.precisions}, "
        f"queries in {embedder.queries_label}"
    )


def _answers(
    questions: list[AnswerQuestion],
    index: ServedIndex,
    catalog: Catalog,
    embedder: Embedder,
    policy: Policy,
    scope: Scope,
    ids: set[str],
) -> AnswerReport:
    """The answer path as `gateway serve` would run it, the LLM included when configured."""
    llm = LlmAnswerer.from_settings(Settings())
    searcher = _fused_searcher(embedder, policy)
    pipeline = AnswerPipeline(searcher, embedder, catalog, llm=llm)
    try:
        return evaluate_answers(index, pipeline, policy, scope, questions, ids)
    finally:
        searcher.close()


def _fused_searcher(embedder: Embedder, policy: Policy) -> HybridSearcher:
    """All lanes, fused, with the policy's pools: what `gateway serve` searches with."""
    budgets = policy.budgets
    lanes = lane_sets(embedder, policy)["fused"]
    return HybridSearcher(lanes, budgets.workers_per_lane, budgets.max_abandoned_per_lane)
