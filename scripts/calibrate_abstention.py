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

A `--workdir` keeps its index for the next run while the split and the passages' numerics
are the same (`recipe.json`); otherwise the index is built again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

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
RECIPE = "recipe.json"  # in the workdir: the split and numerics its index was built with


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
    layout = DataLayout(work / "data")
    # A workdir's index is another split's, or in other numerics, after a run with other
    # options: reused, it was measured in their place.
    recipe = {"split": args.split, "passages": embedder.numerics.label}
    built = work / RECIPE
    if not built.exists() or json.loads(built.read_text()) != recipe:
        built.unlink(missing_ok=True)  # written again only once the index is complete
        shutil.rmtree(layout.root, ignore_errors=True)
        ingest_paths([corpus], layout, embedder)
        built.write_text(json.dumps(recipe) + "\n")
    index = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim)
    assert index is not None
    # The vectors scored are the index's: say their numerics, not the ones asked for.
    print(
        f"index generation {index.generation.id}: passages embedded in "
        f"{index.generation.precisions}, queries in {embedder.queries_label}"
    )
    policy = load_policy(None).policy
    policy = policy.model_copy(
        update={"answering": policy.answering.model_copy(update={"min_relevance": -10.0})}
    )
    searcher = HybridSearcher([Bm25Lane(), DenseLane(embedder), ExactLane()], 4, 2)
    pipeline = AnswerPipeline(searcher, embedder, layout.open_catalog())
    caller = Caller("u", "t", "R", frozenset({"group:g"}), frozenset({"R"}))

    questions = [json.loads(line) for line in (SQUAD / "questions.jsonl").open()]
    rows: list[dict[str, Any]] = []
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
    ans, off, unanswerable = by_kind["answerable"], by_kind["off"], by_kind["unanswerable"]
    print(f"median words {statistics.median(r['words'] for r in ans) if ans else 'n/a'}")
    print("threshold  answered  cited_gold  contains_gold  off_abstained  unans_abstained")
    for t in [x / 1000 for x in range(450, 701, 25)]:
        answered = [r for r in ans if r["relevance"] >= t]
        print(
            f"{t:9.3f}  {share(len(answered), len(ans), 8)}  "
            f"{share(sum(r['cited_gold'] for r in answered), len(ans), 10)}  "
            f"{share(sum(r['contains'] for r in answered), len(ans), 13)}  "
            f"{share(sum(r['relevance'] < t for r in off), len(off), 13)}  "
            f"{share(sum(r['relevance'] < t for r in unanswerable), len(unanswerable), 15)}"
        )
    (work / "calibration.json").write_text(json.dumps(rows))


def share(count: int, total: int, width: int) -> str:
    """count / total, or n/a for a class with no question (`--limit` may leave one empty)."""
    return f"{count / total:{width}.3f}" if total else f"{'n/a':>{width}}"


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
