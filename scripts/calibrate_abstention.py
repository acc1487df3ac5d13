"""Calibrate the extractive answerer's abstention threshold on the SQuAD 2.0 dev slice.

Half of the eight gold articles (and all distractors) are ingested; questions on those
articles are in-corpus (answerable and unanswerable), questions on the other half are
off-corpus. `--split 0` and `--split 1` swap the halves, so a threshold can be checked on
articles it was not chosen on. Every question runs through the real answer pipeline once
with abstention off, recording the best sentence score; the sweep then shows, per
threshold, how often answerable questions are answered (with the gold paragraph cited, and
with a gold answer quoted) and how often off-corpus and unanswerable ones are abstained.

Usage: python scripts/calibrate_abstention.py [--split 0|1] [--workdir DIR] [--limit N]
       [--precision auto|float32|bfloat16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path

from gateway.answer.pipeline import AnswerPipeline
from gateway.domain import Caller
from gateway.embedding import Embedder
from gateway.embedding.onnx_query import enable_fast_queries
from gateway.ingest.pipeline import ingest_paths
from gateway.policy.loader import load_policy
from gateway.retrieval.lanes.bm25 import Bm25Lane
from gateway.retrieval.lanes.dense import DenseLane
from gateway.retrieval.lanes.exact import ExactLane
from gateway.retrieval.scope import RequestScope
from gateway.retrieval.search import HybridSearcher
from gateway.storage.layout import DataLayout, open_served
from gateway.telemetry.stages import StageClock

SQUAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad2-dev"


def normalise(text: str) -> str:
    return " ".join("".join(c.lower() if c.isalnum() else " " for c in text).split())


async def run(args: argparse.Namespace) -> None:
    passages = [json.loads(line) for line in (SQUAD / "passages.jsonl").open()]
    gold_titles = sorted({p["title"] for p in passages if p["source"] == "gold"})
    inside = set(gold_titles[args.split :: 2])
    work = args.workdir or Path(tempfile.mkdtemp(prefix="calibrate-"))
    corpus = work / "corpus.jsonl"
    with corpus.open("w") as out:
        for p in passages:
            if p["source"] == "gold" and p["title"] not in inside:
                continue
            out.write(
                json.dumps(
                    {
                        "doc_id": p["_id"],
                        "title": p["title"],
                        "text": p["text"],
                        "tenant": "t",
                        "region": "R",
                        "acl": ["group:g"],
                        "effective_from": "2020-01-01",
                    }
                )
                + "\n"
            )
    embedder = Embedder(precision=args.precision)
    enable_fast_queries(embedder, work / "models")  # queries as a server embeds them
    print(f"passages in {embedder.numerics.label}, queries in {embedder.queries_label}")
    layout = DataLayout(work / "data")
    if layout.open_catalog().current_generation() is None:
        ingest_paths([corpus], layout, embedder)
    index = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim)
    assert index is not None
    policy = load_policy(None).policy
    policy = policy.model_copy(
        update={"answering": policy.answering.model_copy(update={"min_relevance": -10.0})}
    )
    searcher = HybridSearcher([Bm25Lane(), DenseLane(embedder), ExactLane()], 4, 2)
    pipeline = AnswerPipeline(searcher, embedder, layout.open_catalog())
    caller = Caller("u", "t", "R", frozenset({"group:g"}), frozenset({"R"}))

    questions = [json.loads(line) for line in (SQUAD / "questions.jsonl").open()]
    rows = []
    for q in questions[: args.limit] if args.limit else questions:
        kind = (
            "off"
            if q["title"] not in inside
            else "unanswerable"
            if q["is_impossible"]
            else "answerable"
        )
        scope = RequestScope(index, policy.model_copy(), caller, q["question"], 10, StageClock())
        outcome = await pipeline.answer(scope)
        answer = normalise(outcome.answer.text)
        rows.append(
            {
                "kind": kind,
                "relevance": outcome.answer.relevance,
                "cited_gold": q["gold_passage_id"] in {e.hit.doc_id for _n, e in outcome.citations},
                "contains": any(normalise(a) in answer for a in q["answers"] if normalise(a)),
                "words": len(outcome.answer.text.split()),
            }
        )
    by_kind = {
        k: [r for r in rows if r["kind"] == k] for k in ("answerable", "unanswerable", "off")
    }
    print({k: len(v) for k, v in by_kind.items()})
    print(f"median words {statistics.median(r['words'] for r in by_kind['answerable'])}")
    print("threshold  answered  cited_gold  contains_gold  off_abstained  unans_abstained")
    for t in [x / 1000 for x in range(450, 701, 25)]:
        ans = by_kind["answerable"]
        answered = [r for r in ans if r["relevance"] >= t]
        unanswerable = by_kind["unanswerable"]
        print(
            f"{t:9.3f}  {len(answered) / len(ans):8.3f}  "
            f"{sum(r['cited_gold'] for r in answered) / len(ans):10.3f}  "
            f"{sum(r['contains'] for r in answered) / len(ans):13.3f}  "
            f"{sum(r['relevance'] < t for r in by_kind['off']) / len(by_kind['off']):13.3f}  "
            f"{sum(r['relevance'] < t for r in unanswerable) / len(unanswerable):15.3f}"
        )
    (work / "calibration.json").write_text(json.dumps(rows))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--split", type=int, choices=(0, 1), default=0)
    parser.add_argument(
        "--precision",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="numerics of the passages (queries are float32 in a server)",
    )
    args = parser.parse_args()
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
