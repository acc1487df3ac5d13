"""Retrieval scores on a BEIR benchmark (what `gateway eval --corpus --queries --qrels`
reports; `runner.py` runs the command): ingest the corpus and score every lane.

Every query runs through the real restricted search three times: the BM25 lane alone, the
dense lane alone, and all lanes fused, each with `group_by: document` and 100 results, so
the figures are what `POST /search` returns. All documents carry the metadata given on the
command line and the evaluating caller holds exactly those principals: the permission
filter is on, as in production. Latency is the fused search in process, one query at a
time, measured before the other runs could warm its query-vector cache.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import get_args

from gateway.domain import Caller, Document, Visibility
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.evaluation.beir import Passage, Query
from gateway.evaluation.metrics import ndcg_at, percentile, recall_at, reciprocal_rank
from gateway.ingest.pipeline import ingest_documents, reindex
from gateway.policy.model import Policy, Retrieval
from gateway.restriction import Restriction
from gateway.retrieval.lanes.base import Lane
from gateway.retrieval.lanes.bm25 import Bm25Lane
from gateway.retrieval.lanes.dense import DenseLane
from gateway.retrieval.lanes.exact import ExactLane
from gateway.retrieval.scope import RequestScope
from gateway.retrieval.search import HybridSearcher
from gateway.storage.layout import DataLayout, ServedIndex, open_served
from gateway.telemetry.progress import Progress
from gateway.telemetry.stages import StageClock

DEPTH = 100  # results per query, as `top_k: 100`
DOCUMENT_MODES = get_args(Retrieval.model_fields["document_ranking"].annotation)
VECTOR_MODES = get_args(Retrieval.model_fields["document_vector"].annotation)
FUSION_MODES = get_args(Retrieval.model_fields["document_fusion"].annotation)
# How documents were ranked before issue 21, reported beside whatever the policy says.
EARLIER_DEFAULT: dict[str, object] = {
    "document_ranking": "best_chunk",
    "document_fusion": "rrf",
    "document_bm25": False,
    "document_vector": "off",
}
FINGERPRINT_FILE = "eval-corpus.sha256"
# What eval's documents are made of, in the corpus fingerprint, so that a data dir built by
# an earlier format is ingested again. 2: an untitled passage has no title (in 1, its _id
# was its title, embedded and searched, so a document's name moved its scores).
DOCUMENT_FORMAT = 2


@dataclass(frozen=True)
class Scope:
    """The metadata every benchmark document gets, and so the evaluating caller's rights."""

    tenant: str = "eval"
    region: str = "EVAL"
    acl: tuple[str, ...] = ("group:eval",)
    effective_from: dt.date = dt.date(2000, 1, 1)

    def caller(self) -> Caller:
        return Caller(
            "eval", self.tenant, self.region, frozenset(self.acl), frozenset({self.region})
        )


@dataclass
class LaneScores:
    ndcg_10: float = 0.0
    recall_10: float = 0.0
    recall_100: float = 0.0
    mrr_10: float = 0.0


@dataclass
class Report:
    documents: int
    chunks: int
    queries: int
    lanes: dict[str, LaneScores] = field(default_factory=dict)
    latency_ms: dict[str, float] = field(default_factory=dict)
    degraded: int = 0
    # The policy's ways of ranking documents: those of the unnamed rows.
    document_ranking: str = ""
    document_fusion: str = ""
    document_bm25: bool = False
    document_vector: str = "off"
    # The numerics of the scored vectors (the generation's) and of the queries.
    passage_numerics: str = ""
    query_numerics: str = ""

    def table(self) -> str:
        lines = [
            f"{self.queries} queries over {self.documents} documents ({self.chunks} chunks), "
            f"by document (unless named: document_ranking {self.document_ranking}, "
            f"document_fusion {self.document_fusion}, document_bm25 "
            f"{str(self.document_bm25).lower()}, document_vector {self.document_vector}), "
            "top 100, permission filter on",
            f"{'lane':48} {'nDCG@10':>8} {'R@10':>7} {'R@100':>7} {'MRR@10':>7}",
        ]
        for lane, s in self.lanes.items():
            lines.append(
                f"{lane:48} {s.ndcg_10:8.4f} {s.recall_10:7.4f} {s.recall_100:7.4f} {s.mrr_10:7.4f}"
            )
        lines.append(
            f"fused search latency in process, 1 client: p50 {self.latency_ms['p50']:.1f} ms, "
            f"p95 {self.latency_ms['p95']:.1f} ms; degraded responses: {self.degraded}"
        )
        return "\n".join(lines)


def documents_of(passages: Sequence[Passage], scope: Scope) -> list[Document]:
    visibility = Visibility(scope.tenant, scope.region, scope.acl, scope.effective_from, None)
    return [
        Document(p.doc_id, "1", p.title, "", p.text, visibility, source="corpus") for p in passages
    ]


def claim_data_dir(layout: DataLayout) -> bool:
    """Whether a `--corpus` run may ingest into this data dir: one that eval made (its
    marker is there), or one with no catalog or index yet, marked eval's now, before its
    catalog exists, so that a first run cut short may run again. A data dir holding a
    catalog or index without the marker is another's, perhaps one a server serves: the
    benchmark's documents must never land in it."""
    marker = layout.root / FINGERPRINT_FILE
    if marker.exists():
        return True
    if any(p.exists() for p in (layout.catalog, layout.lexical_root, layout.vectors)):
        return False
    layout.root.mkdir(parents=True, exist_ok=True)
    marker.write_text("\n")  # no corpus fingerprint yet: the run ingests
    return True


def prepare_index(
    layout: DataLayout,
    passages: Sequence[Passage],
    scope: Scope,
    embedder: Embedder,
    policy: Policy,
) -> ServedIndex:
    """Ingest unless this data dir already holds exactly this corpus and scope, and embed
    every passage again unless its vectors are of this model, numerics and chunking.

    The marker holds a line for each: an ingest never embeds an unchanged passage again,
    so a float32 run after a bfloat16 one in the same data dir scored bfloat16 vectors."""
    corpus = hashlib.sha256(repr((DOCUMENT_FORMAT, scope)).encode())
    for p in passages:
        corpus.update(f"{p.doc_id}\0{p.title}\0{p.text}\0".encode())
    recipe = (embedder.name, embedder.fingerprint, embedder.numerics.label, policy.chunking)
    wanted = [corpus.hexdigest(), hashlib.sha256(repr(recipe).encode()).hexdigest()]
    marker = layout.root / FINGERPRINT_FILE
    saved = marker.read_text().split() if marker.exists() else []
    catalog = layout.open_catalog()
    built = catalog.current_generation() is not None
    ann_min_rows = policy.retrieval.ann_min_rows
    if built and saved[1:] != wanted[1:]:  # first: an ingest then adds to its own kind
        reindex(layout, embedder, policy.chunking, progress=True, ann_min_rows=ann_min_rows)
    if not built or saved[:1] != wanted[:1]:
        documents = documents_of(passages, scope)
        ingest_documents(
            documents,
            layout,
            embedder,
            policy.chunking,
            progress=True,
            ann_min_rows=ann_min_rows,
        )
    if saved != wanted:
        marker.write_text("\n".join(wanted) + "\n")
    served = open_served(layout, catalog, embedder.name, embedder.dim)
    assert served is not None  # just ingested
    asker = Restriction.for_caller(scope.caller(), scope.effective_from)
    if served.lexical.search_documents(asker, "", 1) is None:
        # Reused as it is, its BM25-by-document rows would silently fall back to chunks.
        raise GatewayError(
            "index_mismatch",
            f"{layout.root} has no whole-document index in step with its chunks (an "
            "earlier release wrote it): delete it or give another --data-dir",
        )
    return served


def variants(retrieval: Retrieval) -> list[tuple[str, str, dict[str, object]]]:
    """(row, lane set, policy change) for each way of ranking documents the policy does
    not use: every other `document_ranking` and `document_fusion`, fused; every other
    combination of `document_bm25` and `document_vector`, fused; each of those two
    switched for its lane alone; and the earlier default (best chunks fused by RRF). A
    row names what differs from the policy."""
    changes: list[tuple[str, dict[str, object]]] = [
        ("fused", {"document_ranking": mode}) for mode in DOCUMENT_MODES
    ]
    changes += [("fused", {"document_fusion": mode}) for mode in FUSION_MODES]
    changes += [
        ("fused", {"document_bm25": whole, "document_vector": vector})
        for whole, vector in itertools.product((False, True), VECTOR_MODES)
    ]
    changes += [("bm25", {"document_bm25": not retrieval.document_bm25})]
    changes += [("dense", {"document_vector": vector}) for vector in VECTOR_MODES]
    changes += [("fused", EARLIER_DEFAULT)]
    rows: dict[str, tuple[str, str, dict[str, object]]] = {}
    for lane_set, change in changes:
        named = _named(retrieval, change)
        if named:
            row = f"{lane_set}, {named}"
            rows.setdefault(row, (row, lane_set, change))
    return list(rows.values())


def _named(retrieval: Retrieval, change: dict[str, object]) -> str:
    """What `change` alters in `retrieval`, as "document_bm25 + document_vector mean"."""
    parts = []
    for key, value in change.items():
        if getattr(retrieval, key) != value:
            if isinstance(value, bool):
                parts.append(key if value else f"no {key}")
            else:
                parts.append(f"{key} {value}")
    return " + ".join(parts)


def judged_queries(queries: Sequence[Query], qrels: dict[str, dict[str, int]]) -> list[Query]:
    """The queries scored: those with at least one positive judgement."""
    return [q for q in queries if any(g > 0 for g in qrels.get(q.query_id, {}).values())]


def lane_sets(embedder: Embedder, policy: Policy) -> dict[str, list[Lane]]:
    return {
        "fused": [Bm25Lane(), DenseLane(embedder, policy.retrieval), ExactLane()],
        "bm25": [Bm25Lane()],
        "dense": [DenseLane(embedder, policy.retrieval)],
    }


async def _rank(
    searcher: HybridSearcher, index: ServedIndex, policy: Policy, caller: Caller, query: str
) -> tuple[list[str], float, bool]:
    started = time.perf_counter()
    scope = RequestScope(index, policy, caller, query, DEPTH, StageClock())
    outcome = await searcher.search(scope, "document")
    elapsed = (time.perf_counter() - started) * 1000
    return [h.doc_id for h in outcome.hits], elapsed, bool(outcome.degraded)


def evaluate(
    index: ServedIndex,
    embedder: Embedder,
    policy: Policy,
    scope: Scope,
    queries: Sequence[Query],
    qrels: dict[str, dict[str, int]],
    progress: Callable[[str], None] = lambda _line: None,
) -> Report:
    judged = judged_queries(queries, qrels)
    report = Report(index.generation.documents, index.generation.chunks, len(judged))
    caller = scope.caller()
    budgets = policy.budgets

    async def run_lane(name: str, lanes: list[Lane], policy: Policy) -> None:
        searcher = HybridSearcher(lanes, budgets.workers_per_lane, budgets.max_abandoned_per_lane)
        scores, latencies = LaneScores(), []
        shown = Progress(len(judged), f"queries ({name})", "query")
        try:
            for query in judged:
                shown.update(1)
                ranked, elapsed, degraded = await _rank(searcher, index, policy, caller, query.text)
                relevant = qrels[query.query_id]
                scores.ndcg_10 += ndcg_at(ranked, relevant, 10)
                scores.recall_10 += recall_at(ranked, relevant, 10)
                scores.recall_100 += recall_at(ranked, relevant, 100)
                scores.mrr_10 += reciprocal_rank(ranked, relevant, 10)
                latencies.append(elapsed)
                report.degraded += degraded and name == "fused"
        finally:
            shown.close()
            searcher.close()
        n = max(1, len(judged))
        report.lanes[name] = LaneScores(*(v / n for v in vars(scores).values()))
        if name == "fused" and latencies:
            report.latency_ms = {"p50": percentile(latencies, 50), "p95": percentile(latencies, 95)}
        progress(f"{name}: done")

    async def run_all() -> None:
        sets = lane_sets(embedder, policy)
        for name, lanes in sets.items():
            await run_lane(name, lanes, policy)
        # Every other way of ranking documents, to choose the policy's by numbers.
        for name, lane_set, update in variants(policy.retrieval):
            retrieval = policy.retrieval.model_copy(update=update)
            other = policy.model_copy(update={"retrieval": retrieval})
            await run_lane(name, sets[lane_set], other)

    asyncio.run(run_all())
    first = ("bm25", "dense", "fused")
    report.lanes = {
        **{name: report.lanes[name] for name in first},
        **{name: s for name, s in report.lanes.items() if name not in first},
    }
    report.document_ranking = policy.retrieval.document_ranking
    report.document_fusion = policy.retrieval.document_fusion
    report.document_bm25 = policy.retrieval.document_bm25
    report.document_vector = policy.retrieval.document_vector
    report.passage_numerics = index.generation.precisions
    report.query_numerics = embedder.queries_label
    return report
