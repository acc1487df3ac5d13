"""Measure what naming BM25 hits by row saves (gateway/storage/rows.py): the same synthetic
chunks in a partition with rows and in one written as an earlier release wrote it (no row
field: every hit's ID read from Tantivy's document store), the same restricted searches
on each, alternated, in process. Prints the median and p95 of `TantivyIndex.search` at
each depth.

Usage: PYTHONPATH=. python scripts/measure_lexical_rows.py [--chunks 200000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import tantivy

from gateway.domain import Chunk, Visibility
from gateway.restriction import Restriction
from gateway.storage.lexical import TantivyIndex, _schema

WORDS = [f"w{i}" for i in range(20_000)]
TODAY = dt.date(2026, 1, 1)
CALLER = Restriction("acme", frozenset({"group:all"}), frozenset({"EU"}), TODAY)
BATCH = 50_000


def chunks(count: int, seed: int) -> list[Chunk]:
    rng = random.Random(seed)
    v = Visibility("acme", "EU", ("group:all",), dt.date(2020, 1, 1), None)
    made = []
    for i in range(count):
        text = " ".join(rng.choices(WORDS[:5000] if i % 2 else WORDS, k=110))
        doc, ordinal = f"doc-{i // 4}", i % 4
        made.append(Chunk(f"{doc}@1:{ordinal}", doc, "1", ordinal, "title", "", text, 110, v))
    return made


def build(path: Path, rows: bool, corpus: list[Chunk]) -> TantivyIndex:
    path.mkdir(parents=True)
    if not rows:
        tantivy.Index(_schema(rows=False), path=str(path))  # as an earlier release made it
    index = TantivyIndex(path)
    for start in range(0, len(corpus), BATCH):
        index.apply([], corpus[start : start + BATCH])
    return index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--depths", type=int, nargs="*", default=[50, 200, 1000])
    args = parser.parse_args()
    corpus = chunks(args.chunks, seed=1)
    rng = random.Random(2)
    queries = [" ".join(rng.choices(WORDS[:3000], k=4)) for _ in range(args.queries)]
    with tempfile.TemporaryDirectory(prefix="measure-lexical-rows-") as scratch:
        indexes = {
            "with rows": build(Path(scratch) / "rows", True, corpus),
            "without rows": build(Path(scratch) / "legacy", False, corpus),
        }
        print(f"{args.chunks:,} chunks, {args.queries} queries per depth, alternated")
        for depth in args.depths:
            times: dict[str, list[float]] = {name: [] for name in indexes}
            for query in queries:
                for name, index in indexes.items():
                    start = time.perf_counter()
                    index.search(CALLER, query, depth, stored=10)
                    times[name].append((time.perf_counter() - start) * 1000)
            for name, ms in times.items():
                p50, p95 = statistics.median(ms), float(np.percentile(ms, 95))
                print(f"depth {depth:>5} {name:<13} p50 {p50:6.2f} ms  p95 {p95:6.2f} ms")


if __name__ == "__main__":
    main()
