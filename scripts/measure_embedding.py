"""Measure passage embedding by numerics (issue 32): speed, ingest rate and the quality guard.

1. `speed`: passages/s of `Embedder.embed` on the first N passages of a BEIR corpus, in
   float32 and bfloat16 (and sentence-transformers' float32, the code before), rounds
   alternated in one process so that the machine's drift touches every arm alike.
2. `ingest`: chunks/s of the real ingest path (chunking, embedding, Tantivy, LanceDB,
   catalog) for the first N passages into a fresh data dir, float32 and bfloat16
   alternated.
3. `quality`: nDCG@10 and Recall@100 of dense retrieval over the whole corpus (each passage
   one vector, the model's 256-token cut), queries in float32 as a server embeds them,
   passages in float32 and in bfloat16; and each passage's cosine between the two.
   This isolates the numerics: the fused figures of the product come from `gateway eval`
   (docs/evaluation.md, "Embedding precision").

Usage: python scripts/measure_embedding.py speed|ingest|quality --corpus C [--queries Q
       --qrels R] [--passages N] [--rounds R]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from gateway.domain import Document, Visibility
from gateway.embedding import Embedder
from gateway.evaluation.beir import Passage, load_corpus, load_qrels, load_queries
from gateway.evaluation.metrics import ndcg_at, recall_at
from gateway.ingest.pipeline import ingest_documents
from gateway.storage.layout import DataLayout

ARMS = ("float32", "bfloat16")


def texts_of(passages: list[Passage]) -> list[str]:
    return [f"{p.title}\n{p.text}" if p.title else p.text for p in passages]


def speed(passages: list[Passage], rounds: int) -> None:
    texts = texts_of(passages)
    embedders = {arm: Embedder(precision=arm) for arm in ARMS}  # type: ignore[arg-type]
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(embedders["float32"].model_dir), device="cpu")
    runs: dict[str, list[float]] = {arm: [] for arm in (*ARMS, "sentence-transformers")}
    for embedder in embedders.values():
        embedder.embed(texts[:32])  # loaded and warm before any round counts
    reference.encode(texts[:32], batch_size=16)
    for _ in range(rounds):
        for arm, embedder in embedders.items():
            started = time.perf_counter()
            embedder.embed(texts)
            runs[arm].append(len(texts) / (time.perf_counter() - started))
        started = time.perf_counter()
        reference.encode(texts, batch_size=16, normalize_embeddings=True)
        runs["sentence-transformers"].append(len(texts) / (time.perf_counter() - started))
    for arm, rates in runs.items():
        print(f"{arm:22s} passages/s: " + ", ".join(f"{r:.1f}" for r in rates))
        print(f"{'':22s} median {statistics.median(rates):.1f}")


def ingest(passages: list[Passage], rounds: int) -> None:
    today = dt.date(2020, 1, 1)
    documents = [
        Document(
            doc_id=p.doc_id,
            version="1",
            title=p.title or p.doc_id,
            uri="",
            text=p.text,
            visibility=Visibility("eval", "EVAL", ("group:eval",), today, None),
        )
        for p in passages
    ]
    embedders = {arm: Embedder(precision=arm) for arm in ARMS}  # type: ignore[arg-type]
    for embedder in embedders.values():
        embedder.embed(["warm"])
    rates: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for _ in range(rounds):
        for arm, embedder in embedders.items():
            with tempfile.TemporaryDirectory() as scratch:
                report = ingest_documents(documents, DataLayout(Path(scratch)), embedder)
            rates[arm].append(report.chunks / report.seconds)
            print(
                f"{arm}: {report.chunks} chunks in {report.seconds:.1f} s "
                f"(embedding {report.embed_seconds:.1f} s)",
                flush=True,
            )
    for arm, values in rates.items():
        print(
            f"{arm:10s} chunks/s: "
            + ", ".join(f"{v:.1f}" for v in values)
            + f"; median {statistics.median(values):.1f}"
        )


def quality(passages: list[Passage], queries_path: Path, qrels_path: Path) -> None:
    qrels = load_qrels(qrels_path)
    queries = [q for q in load_queries(queries_path) if q.query_id in qrels]
    ids = [p.doc_id for p in passages]
    texts = texts_of(passages)
    vectors = {}
    for arm in ARMS:
        embedder = Embedder(precision=arm)  # type: ignore[arg-type]
        started = time.perf_counter()
        vectors[arm] = embedder.embed(texts, batch_size=32)
        print(f"{arm}: {len(texts)} passages in {time.perf_counter() - started:.0f} s", flush=True)
    asked = Embedder(precision="float32").float32_vectors([q.text for q in queries])
    cosines = (vectors["float32"] * vectors["bfloat16"]).sum(axis=1)
    print(
        f"passage cosine float32~bfloat16: min {cosines.min():.5f}, "
        f"p1 {np.percentile(cosines, 1):.5f}, mean {cosines.mean():.5f}"
    )
    for arm in ARMS:
        scores = asked @ vectors[arm].T
        ndcg, recall = [], []
        for row, query in zip(scores, queries, strict=True):
            ranked = [ids[i] for i in np.argsort(-row)[:100]]
            ndcg.append(ndcg_at(ranked, qrels[query.query_id], 10))
            recall.append(recall_at(ranked, qrels[query.query_id], 100))
        print(
            f"{arm:10s} nDCG@10 {statistics.mean(ndcg):.4f}  "
            f"Recall@100 {statistics.mean(recall):.4f}  ({len(queries)} queries)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("speed", "ingest", "quality"))
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--queries", type=Path)
    parser.add_argument("--qrels", type=Path)
    parser.add_argument("--passages", type=int, default=0, help="the first N; 0: all")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    passages = load_corpus(args.corpus)
    if args.passages:
        passages = passages[: args.passages]
    if args.mode == "speed":
        speed(passages, args.rounds)
    elif args.mode == "ingest":
        ingest(passages, args.rounds)
    else:
        if not (args.queries and args.qrels):
            parser.error("quality needs --queries and --qrels")
        quality(passages, args.queries, args.qrels)


if __name__ == "__main__":
    main()
