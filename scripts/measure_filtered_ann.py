"""Recall@10 of the filtered dense lane against exact search, at 1% and 10% selectivity.

Usage: python scripts/measure_filtered_ann.py [--rows N] [--queries Q] [--workdir DIR]
Builds a LanceDB chunk table of N rows whose vectors mix pairs of real MiniLM embeddings of
SQuAD sentences plus small noise (realistic neighbourhoods, not uniform random vectors),
ACLs spread over 100 groups, and an IVF-PQ index. For a caller holding 1 group (1% of the
rows), 10 groups (10%) and all 100 (100%), 100 real question embeddings are searched by
LanceDB's prefiltered ANN at several nprobes/refine settings, by LanceDB scoring every
permitted row, and by the in-memory exact engine; prints recall@10 against exact search,
p50 latency, and the engine the dense lane chooses (`choose_engine`) with the default
policy.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from gateway.domain import Chunk, Visibility
from gateway.embedding import Embedder
from gateway.ingest.chunk import split_sentences
from gateway.policy.model import Retrieval
from gateway.restriction import Restriction
from gateway.retrieval.lanes.dense import choose_engine
from gateway.storage.flat import FlatVectors
from gateway.storage.vectors import VectorStore

SQUAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad2-dev"
GROUPS = 100
SETTINGS = [(8, 1), (32, 4), (64, 8), (64, 20), (128, 20)]  # (nprobes, refine_factor)


def build(store: VectorStore, embedder: Embedder, rows: int) -> None:
    passages = [json.loads(line)["text"] for line in (SQUAD / "passages.jsonl").open()]
    sentences = [s for p in passages for s in split_sentences(p)][:2000]
    base = embedder.embed(sentences, batch_size=64)
    rng = np.random.default_rng(0)
    for start in range(0, rows, 50_000):
        count = min(50_000, rows - start)
        # Each row mixes two real sentence vectors (weights 0.5-1 and the rest) plus a
        # little noise: distinct points on the sentences' manifold. (Noisy copies of the
        # same few sentences make ties that measure PQ rounding, not retrieval.)
        first, second = rng.integers(0, len(base), count), rng.integers(0, len(base), count)
        weight = rng.uniform(0.5, 1.0, (count, 1)).astype(np.float32)
        vectors = weight * base[first] + (1 - weight) * base[second]
        vectors += rng.normal(0, 0.01, (count, embedder.dim)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        chunks = [
            Chunk(
                f"c{i}@1:0",
                f"c{i}",
                "1",
                0,
                "",
                "",
                "",
                1,
                Visibility("t", "R", (f"group:g{i % GROUPS}",), dt.date(2020, 1, 1), None),
            )
            for i in range(start, start + count)
        ]
        store.apply([], chunks, vectors, {})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="filtered-ann-"))
    embedder = Embedder()
    store = VectorStore(work / "vectors", embedder.dim, table="bench")
    if store.count() != args.rows:
        started = time.perf_counter()
        build(store, embedder, args.rows)
        print(f"built {args.rows} rows in {time.perf_counter() - started:.0f} s")
    started = time.perf_counter()
    store.ensure_ann_index(min_rows=0)
    print(f"IVF-PQ index ready in {time.perf_counter() - started:.0f} s")
    flat = FlatVectors(store.snapshot())
    questions = [json.loads(line)["question"] for line in (SQUAD / "questions.jsonl").open()]
    queries = embedder.embed(questions[: args.queries])
    defaults = Retrieval()
    for groups in (1, 10, 100):
        principals = frozenset(f"group:g{g}" for g in range(groups))
        restriction = Restriction("t", principals, frozenset({"R"}), dt.date.today())
        rows = flat.permitted_rows(restriction)
        exact_ms, exact = [], []
        for q in queries:
            t = time.perf_counter()
            exact.append({h.chunk_id for h in flat.search(rows, q, 10)})
            exact_ms.append((time.perf_counter() - t) * 1000)
        chosen = choose_engine(rows.size, flat.size, lambda: store.has_ann_index, defaults)
        print(f"\n{groups}% of {args.rows} rows ({rows.size} permitted); engine chosen: {chosen}")
        print(f"  exact (flat, in memory): recall 1.000, p50 {statistics.median(exact_ms):.1f} ms")
        for label, options in [
            ("LanceDB exact (every permitted row)", {"exact": True}),
            *(
                (f"LanceDB IVF-PQ nprobes {n:3} refine {r}", {"nprobes": n, "refine_factor": r})
                for n, r in SETTINGS
            ),
        ]:
            recalls, took = [], []
            for q, truth in zip(queries, exact, strict=True):
                t = time.perf_counter()
                found = store.search(restriction, q, 10, **options)  # type: ignore[arg-type]
                took.append((time.perf_counter() - t) * 1000)
                recalls.append(len(truth & {h.chunk_id for h in found}) / 10)
            print(
                f"  {label}: recall {statistics.mean(recalls):.3f}, "
                f"p50 {statistics.median(took):.1f} ms"
            )


if __name__ == "__main__":
    main()
