"""Measure ingest rate and /search latency over real HTTP on the SQuAD 2.0 dev slice.

Usage: python scripts/measure_search.py [--queries N] [--workdir DIR] [--sentence-documents]
Ingests ../shared/data/squad2-dev/passages.jsonl (601 paragraphs) with one tenant, region
and ACL, starts `gateway serve` on loopback with a throwaway issuer, sends the first N
answerable questions one at a time, and prints p50/p95 latency plus Recall@5/@10 of the
gold paragraph (by doc_id): the SQuAD yardstick beside `gateway bench`.

`--sentence-documents` also ingests every sentence of every paragraph as a document of its
own (about 3,600 documents in all), for latency on a few thousand documents of real text;
recall still counts the gold paragraph only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from gateway.bench.server import gateway_command, running_gateway, throwaway_issuer
from gateway.ingest.chunk import split_sentences

SQUAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad2-dev"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--group-by", choices=("chunk", "document"), default="chunk")
    parser.add_argument("--reuse", action="store_true", help="Keep an index already built")
    parser.add_argument(
        "--sentence-documents", action="store_true", help="Each sentence a document as well"
    )
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="measure-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "squad.jsonl"
    common = {"tenant": "acme", "region": "EU", "acl": ["group:staff"]}
    common["effective_from"] = "2020-01-01"
    with corpus.open("w") as out:
        for line in (SQUAD / "passages.jsonl").open():
            p = json.loads(line)
            documents = [(p["_id"], p["text"])]
            if args.sentence_documents:
                sentences = split_sentences(p["text"])
                documents += [(f"{p['_id']}-s{n}", t) for n, t in enumerate(sentences)]
            for doc_id, text in documents:
                document = {"doc_id": doc_id, "title": p["title"], "text": text, **common}
                out.write(json.dumps(document) + "\n")
    exe = gateway_command()
    data = work / "data"
    if not (args.reuse and (data / "catalog.db").exists()):
        shutil.rmtree(data, ignore_errors=True)
        started = time.perf_counter()
        result = subprocess.run(
            [exe, "ingest", str(corpus), "--data-dir", str(data)],
            capture_output=True,
            text=True,
            check=True,
        )
        wall = time.perf_counter() - started
        print(result.stdout.strip(), f"(wall {wall:.1f} s incl. model load)")

    issuer = throwaway_issuer(work, data)
    with running_gateway(["serve"], issuer.env) as served:
        token = issuer.token()
        questions = [json.loads(line) for line in (SQUAD / "questions.jsonl").open()]
        answerable = [q for q in questions if not q["is_impossible"]][: args.queries]

        def one(q: dict[str, object]) -> tuple[float, list[str], bool, int]:
            t = time.perf_counter()
            body = {"query": q["question"], "top_k": args.top_k, "group_by": args.group_by}
            r = client.post("/search", json=body)
            elapsed = (time.perf_counter() - t) * 1000
            if r.status_code != 200:
                return elapsed, [], False, r.status_code
            body = r.json()
            return elapsed, [x["doc_id"] for x in body["results"]], bool(body["degraded"]), 200

        headers = {"Authorization": f"Bearer {token}"}
        limits = httpx.Limits(max_connections=args.concurrency)
        with (
            httpx.Client(
                base_url=served.base, headers=headers, limits=limits, timeout=30
            ) as client,
            ThreadPoolExecutor(args.concurrency) as pool,
        ):
            wall = time.perf_counter()
            outcomes = list(pool.map(one, answerable))
            wall = time.perf_counter() - wall
        latencies = [o[0] for o in outcomes]
        at5 = sum(
            q["gold_passage_id"] in o[1][:5] for q, o in zip(answerable, outcomes, strict=True)
        )
        at10 = sum(q["gold_passage_id"] in o[1] for q, o in zip(answerable, outcomes, strict=True))
        degraded = sum(o[2] for o in outcomes)
        errors = sum(o[3] != 200 for o in outcomes)
        qs = statistics.quantiles(latencies, n=100)
        n = len(answerable)
        print(
            f"/search over HTTP (top_k {args.top_k}, group_by {args.group_by}), {n} queries, "
            f"{args.concurrency} clients: p50 {qs[49]:.1f} ms, "
            f"p95 {qs[94]:.1f} ms, max {max(latencies):.1f} ms; {n / wall:.1f} QPS; "
            f"degraded {degraded}, errors {errors}"
        )
        print(f"gold paragraph Recall@5 {at5 / n:.3f}, Recall@10 {at10 / n:.3f}")


if __name__ == "__main__":
    main()
