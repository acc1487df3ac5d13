"""What `gateway bench` does, apart from parsing its options (in `gateway.cli.bench`).

1. Build, or reuse, a corpus in the bench's own data dir: synthetic (`gateway.bench.
   synthetic`) or a JSONL corpus given with `--corpus`, whose documents get the benchmark's
   visibility so that `--selectivity` means the same on both.
2. Measure ingest of real text with the real model at the policy's chunk size: the packaged
   demo corpus, into a scratch data dir, before the server starts (nothing shares the CPU).
3. Start the real server (`gateway serve`) trusting a throwaway issuer; time it to ready.
4. Over HTTP on loopback: every query once on /search (`top_k` 10), as many others on
   /search by document (`group_by: document`), then the first ones on /answer, from
   `--concurrency` client threads. The client shares the machine's cores with the server.
5. Read the server's peak resident memory, stop it, and measure the dense lane's recall@10
   against exact search under the same filter, in process, with the serving policy.

Targets are reported, not enforced: the command exits 0 whenever it ran.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gateway.bench import synthetic
from gateway.bench.load import Phase, drive, percentiles
from gateway.bench.server import running_gateway, throwaway_issuer
from gateway.demo.run import CORPUS_DIR
from gateway.domain import Document
from gateway.embedding import Embedder
from gateway.embedding.onnx_query import enable_fast_queries
from gateway.embedding.precision import PrecisionSetting
from gateway.ingest.chunk import split_sentences
from gateway.ingest.pipeline import ingest_documents, ingest_paths
from gateway.placement import LaneCpus
from gateway.policy.loader import load_policy
from gateway.policy.model import Policy
from gateway.restriction import Restriction
from gateway.retrieval.lanes.dense import DenseLane
from gateway.retrieval.search import today_utc
from gateway.storage.layout import DataLayout, ServedIndex, open_served

BASE_SENTENCES = 4000
SMALL_BENCH = 2000  # chunks below which ingest is measured on part of the demo corpus
BATCH_CHUNKS = 100_000  # chunks per generation while building: bounds the builder's memory
RECALL_QUERIES = 100
WARMUP_QUERIES = 10
# The second /search run ranks whole documents, as a search page of documents does.
BY_DOCUMENT: dict[str, object] = {"group_by": "document"}
MANIFEST = "bench/manifest.json"


@dataclass(frozen=True)
class BenchOptions:
    chunks: int = 200_000
    queries: int = 200
    concurrency: int = 1
    selectivity: float = 0.1
    corpus: Path | None = None
    json_out: Path | None = None
    data_dir: Path | None = None
    policy_dir: Path | None = None
    seed: int = 0
    precision: PrecisionSetting = "auto"
    model_cache_dir: Path | None = None  # the query encoder's export; <data dir>/models
    processes: int = 1  # the measured server's (`gateway serve --processes`)
    lane_cpus: LaneCpus = "shared"  # reported only: what the server's setting amounts to

    @property
    def synthetic(self) -> bool:
        return self.corpus is None


def run_bench(options: BenchOptions, say: Callable[[str], None]) -> dict[str, Any]:
    """Run the benchmark and return its report (also printed, and written as JSON)."""
    policy = load_policy(options.policy_dir).policy
    source = _source(options)
    layout = DataLayout(options.data_dir or Path(tempfile.gettempdir()) / "gateway-bench" / source)
    embedder = Embedder(precision=options.precision)
    # A corpus is checked before the model loads (a refused one writes nothing).
    built_s, queries = _corpus(layout, options, source, policy, embedder, say)
    # as `gateway serve` embeds queries, and from the same cache
    enable_fast_queries(embedder, options.model_cache_dir or layout.root / "models")
    say("measuring ingest of real text (the demo corpus) ...")
    ingest = _ingest_rate(embedder, policy, options.chunks)
    picked = _pick(queries, 2 * options.queries + WARMUP_QUERIES, options.seed)
    warmup, questions = picked[:WARMUP_QUERIES], picked[WARMUP_QUERIES:][: options.queries]
    # Other questions for the by-document run, so that none finds its vector cached.
    by_document_questions = picked[WARMUP_QUERIES + options.queries :]

    issuer = throwaway_issuer(layout.root / "bench", layout.root)
    if options.policy_dir is not None:
        issuer.env["GATEWAY_POLICY_DIR"] = str(options.policy_dir)
    issuer.env["GATEWAY_SERVE_PROCESSES"] = str(options.processes)
    groups = tuple(synthetic.caller_groups(options.selectivity))
    token = issuer.token(synthetic.TENANT, synthetic.REGION, groups)
    say(f"serving {layout.root} and sending {len(questions)} queries per endpoint ...")
    with running_gateway(["serve", "--no-worker"], issuer.env) as served:
        warmed = drive(served.base, token, "/search", warmup, 1)
        if warmed.errors:  # the measured phases may then fail for the same reason
            failed = ", ".join(f"{n} {why}" for why, n in warmed.failures.items())
            say(f"warm-up: {warmed.errors} of {len(warmup)} searches failed ({failed})")
        cpu_before = served.cpu_s()
        search = drive(served.base, token, "/search", questions, options.concurrency)
        cpu_after = served.cpu_s()
        by_document = drive(
            served.base, token, "/search", by_document_questions, options.concurrency, BY_DOCUMENT
        )
        answer = drive(served.base, token, "/answer", questions, options.concurrency)
        memory = served.memory_mb()
        startup_s = served.startup_s

    say("measuring dense recall@10 against exact search ...")
    index = _open(layout, embedder)
    restriction = Restriction(
        synthetic.TENANT,
        frozenset(f"group:{g}" for g in groups),
        frozenset({synthetic.REGION}),
        today_utc(),
    )
    recall, engines = _dense_recall(index, restriction, embedder, policy, questions)
    visible = int(index.flat.permitted_rows(restriction).size)

    report: dict[str, Any] = {
        "chunks": index.flat.size,
        "queries": len(questions),
        "concurrency": options.concurrency,
        "selectivity": options.selectivity,
        "synthetic": options.synthetic,
        "search_ms": percentiles(search.latencies_ms),
        "answer_ms": percentiles(answer.latencies_ms),
        "search_by_document_ms": percentiles(by_document.latencies_ms),
        "stages_ms": _stages(search, answer),
        "qps": round(search.qps, 1),
        "errors": search.errors + by_document.errors + answer.errors,
        "degraded": search.degraded + by_document.degraded + answer.degraded,
        "dense_recall_at_10": recall,
        "rss_mb": memory.get("peak"),
        "startup_s": round(startup_s, 2),
        "ingest_chunks_per_s": ingest["chunks_per_s"],
        "ingest_tokens_per_s": ingest["tokens_per_s"],
        # Beyond the contract: what the figures above depend on.
        "answer_qps": round(answer.qps, 1),
        # Why requests failed, by phase, if any did: {"answer": {"503 Service not ready": 3}}.
        "failures": {
            name: dict(phase.failures)
            for name, phase in (
                ("search", search),
                ("search_by_document", by_document),
                ("answer", answer),
            )
            if phase.failures
        },
        # The server's CPU (all threads) per /search by chunk: what caps QPS on few cores.
        "search_server_cpu_ms": _per_request(cpu_before, cpu_after, len(questions)),
        "search_by_document_qps": round(by_document.qps, 1),
        "stages_by_document_ms": _stages(by_document, Phase()),
        "visible_chunks": visible,
        "visible_share": round(visible / max(index.flat.size, 1), 4),
        "dense_engines": engines,
        "rss_end_mb": memory.get("rss"),
        "pss_end_mb": memory.get("pss"),
        "build_s": built_s,
        "ingest_chunks": ingest["chunks"],
        "data_dir": str(layout.root),
        "server_processes": options.processes,
        "lane_cpus": options.lane_cpus,
    }
    say(format_table(report))
    if options.json_out is not None:
        options.json_out.write_text(json.dumps(report, indent=2) + "\n")
    return report


def format_table(report: dict[str, Any]) -> str:
    kind = "synthetic" if report["synthetic"] else "corpus"
    lines = [
        f"{report['chunks']:,} chunks ({kind}), {report['queries']} queries, "
        f"{report['concurrency']} clients, selectivity {report['selectivity']} "
        f"({report['visible_chunks']:,} chunks visible); serving processes "
        f"{report['server_processes']}, lanes {report['lane_cpus']}",
        "",
        f"{'measure':<28}{'p50':>10}{'p95':>10}{'p99':>10}",
    ]
    for name, stages in (
        ("search_ms", "stages_ms"),
        ("search_by_document_ms", "stages_by_document_ms"),
        ("answer_ms", None),
    ):
        q = report[name]
        lines.append(f"{name:<28}{q['p50']:>10.1f}{q['p95']:>10.1f}{q['p99']:>10.1f}")
        for stage, q in report[stages].items() if stages else ():
            lines.append(f"  {stage:<26}{q['p50']:>10.2f}{q['p95']:>10.2f}")
    lines += [
        "",
        f"search QPS {report['qps']}, by document {report['search_by_document_qps']}, "
        f"answer QPS {report['answer_qps']}; "
        f"errors {report['errors']}, degraded {report['degraded']}"
        + "".join(
            f"\n  {name}: {count} failed, {why}"
            for name, failed in report["failures"].items()
            for why, count in failed.items()
        ),
        f"server CPU per search {report['search_server_cpu_ms']} ms",
        f"dense recall@10 {report['dense_recall_at_10']} (engines {report['dense_engines']})",
        f"server memory peak {report['rss_mb']} MB; startup to ready {report['startup_s']} s",
        f"ingest of real text: {report['ingest_chunks_per_s']} chunks/s, "
        f"{report['ingest_tokens_per_s']} tokens/s ({report['ingest_chunks']} chunks)",
    ]
    return "\n".join(lines)


# -- the corpus -------------------------------------------------------------------------------


def _source(options: BenchOptions) -> str:
    """Names the corpus: the default data dir's name, and part of the recipe."""
    if options.corpus is None:
        return f"synthetic-{options.chunks}"
    return "corpus-" + hashlib.sha256(options.corpus.read_bytes()).hexdigest()[:16]


def _corpus(
    layout: DataLayout,
    options: BenchOptions,
    source: str,
    policy: Policy,
    embedder: Embedder,
    say: Callable[[str], None],
) -> tuple[float | None, list[str]]:
    """Build the corpus unless the data dir already holds it; (build seconds or None when
    reused, the questions to ask)."""
    manifest = layout.root / MANIFEST
    recipe = _recipe(options, source, embedder)
    if manifest.exists():
        saved = json.loads(manifest.read_text())
        # A manifest without queries (an earlier release wrote one for a corpus with no
        # sentence to ask) is built again: there is nothing to measure with.
        if saved.get("recipe") == recipe and saved.get("queries"):
            say(f"reusing the corpus in {layout.root}")
            return None, list(saved["queries"])
        for path in layout.root.iterdir():  # another bench corpus: built anew
            if path.name != "models":  # (the query encoder's export stays valid)
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    elif layout.catalog.exists():
        raise ValueError(
            f"{layout.root} holds an index gateway bench did not build; "
            "give an empty or new --data-dir"
        )
    started = time.perf_counter()
    if options.corpus is not None:
        queries = _build_from_corpus(layout, options, policy, embedder, say)
    else:
        queries = _build_synthetic(layout, options, policy, embedder, say)
    built_s = round(time.perf_counter() - started, 1)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({"recipe": recipe, "queries": queries, "build_s": built_s}))
    return built_s, queries


def _recipe(options: BenchOptions, source: str, embedder: Embedder) -> dict[str, Any]:
    """What the data dir was built from: while it matches, the corpus is reused. The
    numerics too: a float32 run after a bfloat16 one measured bfloat16 vectors."""
    return {
        "source": source,
        "seed": options.seed,
        "model": embedder.fingerprint,
        "numerics": embedder.numerics.label,
        "format": 2,
    }


def _build_synthetic(
    layout: DataLayout,
    options: BenchOptions,
    policy: Policy,
    embedder: Embedder,
    say: Callable[[str], None],
) -> list[str]:
    # Two sentences make a chunk: a small corpus needs no more than two per chunk.
    base = synthetic.sentences(min(BASE_SENTENCES, max(200, 2 * options.chunks)), options.seed)
    say(f"embedding {len(base)} generated sentences with the real model ...")
    vectors, tokens = synthetic.embed_sentences(embedder, base)
    batches = synthetic.batches(options.chunks, base, vectors, tokens, BATCH_CHUNKS, options.seed)
    made = 0
    for batch in batches:
        made += len(batch.encoded.chunks)
        last = made >= options.chunks
        report = ingest_documents(
            batch.documents,
            layout,
            embedder,
            policy.chunking,
            # The ANN index is built once, over the whole table, with the last batch.
            ann_min_rows=policy.retrieval.ann_min_rows if last else None,
            encoded=batch.encoded,
        )
        say(f"  generation {report.generation}: {made:,} chunks ({report.seconds:.0f} s)")
    return [s.question for s in base]


def _build_from_corpus(
    layout: DataLayout,
    options: BenchOptions,
    policy: Policy,
    embedder: Embedder,
    say: Callable[[str], None],
) -> list[str]:
    from gateway.ingest.sources import load_documents

    assert options.corpus is not None
    rng = np.random.default_rng(options.seed)
    documents = [
        dataclasses.replace(d, visibility=synthetic.draw_visibility(rng))
        for d in load_documents([options.corpus])
    ]
    questions = _questions_from(documents)
    if not questions:  # checked before the build: the queries are taken from its text
        raise ValueError(
            f"{options.corpus}: no document has a sentence of six words or more to ask "
            "as a query; nothing was ingested"
        )
    say(f"ingesting {len(documents)} documents with the real model ...")
    ingest_documents(
        documents, layout, embedder, policy.chunking, progress=True,
        ann_min_rows=policy.retrieval.ann_min_rows,
    )  # fmt: skip
    return questions


def _questions_from(documents: Sequence[Document]) -> list[str]:
    """A query per document: its first sentence of six words or more, at most 25 words."""
    out = []
    for d in documents:
        sentence = next((s for s in split_sentences(d.text) if len(s.split()) >= 6), None)
        if sentence:
            out.append(" ".join(sentence.split()[:25]))
    return out


def _pick(queries: Sequence[str], count: int, seed: int) -> list[str]:
    """`count` queries, distinct while there are enough (no query-vector cache hits)."""
    rng = np.random.default_rng(seed + 2)
    order = rng.permutation(len(queries))
    return [queries[order[i % len(queries)]] for i in range(count)]


def _ingest_rate(embedder: Embedder, policy: Policy, chunks: int) -> dict[str, Any]:
    """Ingest of the demo corpus; a bench of a few hundred chunks (a smoke run, such as the
    test's) takes one document in four of it, a rougher figure at a quarter of the cost."""
    embedder.embed(["load and warm the passage model"])  # a load is not ingest throughput
    documents = sorted(CORPUS_DIR.glob("*.md"))
    if chunks < SMALL_BENCH:
        documents = documents[::4]
    scratch = Path(tempfile.mkdtemp(prefix="gateway-bench-ingest-"))
    try:
        layout = DataLayout(scratch)
        report = ingest_paths(documents, layout, embedder, policy.chunking)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "chunks": report.chunks,
        "chunks_per_s": round(report.chunks / report.seconds, 1),
        "tokens_per_s": round(report.tokens / report.seconds, 1),
    }


# -- after the run ------------------------------------------------------------------------------


def _open(layout: DataLayout, embedder: Embedder) -> ServedIndex:
    index = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim)
    assert index is not None
    return index


def _dense_recall(
    index: ServedIndex,
    restriction: Restriction,
    embedder: Embedder,
    policy: Policy,
    questions: Sequence[str],
) -> tuple[float, dict[str, int]]:
    """Mean recall@10 of the dense lane as served (its engine choice included) against
    exact search over the same permitted rows; and how often each engine served."""
    lane = DenseLane(embedder, policy.retrieval)
    rows = index.flat.permitted_rows(restriction)
    recalls: list[float] = []
    engines: dict[str, int] = {}
    for question in questions[:RECALL_QUERIES]:
        served = lane.run(index, restriction, question, 10)
        engine = str(served.details.get("engine", "none"))
        engines[engine] = engines.get(engine, 0) + 1
        vector = embedder.embed_query(question, scope=restriction.asker)  # as the lane did
        exact = {h.chunk_id for h in index.flat.search(rows, vector, 10)}
        if exact:
            recalls.append(len(exact & set(served.chunk_ids)) / len(exact))
    return (round(float(np.mean(recalls)), 4) if recalls else 1.0), engines


def _per_request(before: float | None, after: float | None, requests: int) -> float | None:
    if before is None or after is None or not requests:
        return None
    return round((after - before) * 1000 / requests, 2)


def _stages(search: Phase, answer: Phase) -> dict[str, dict[str, float]]:
    """Each stage's p50/p95: retrieval stages from /search, the answer's own from /answer."""
    stages = {name: percentiles(ms, (50, 95)) for name, ms in search.stages_ms.items()}
    for name, ms in answer.stages_ms.items():
        stages.setdefault(name, percentiles(ms, (50, 95)))
    return stages
