"""Measure passage embedding by numerics (issue 32): speed, ingest rate and the quality guard.

1. `speed`: passages/s of `Embedder.embed` on the first N passages of a BEIR corpus, in
   float32 and bfloat16 (and sentence-transformers' float32, the code before), rounds
   alternated in one process so that the machine's drift touches every arm alike.
2. `ingest`: chunks/s of the real ingest path (chunking, embedding, Tantivy, LanceDB,
   catalog) for the first N passages into a fresh data dir, the arms alternated.
3. `quality`: nDCG@10 and Recall@100 of dense retrieval over the whole corpus (each passage
   one vector, the model's 256-token cut), passages in float32 and in bfloat16, queries
   as a server embeds them: through ONNX in float32 and in int8 (`--query-arms`); and each
   passage's (and query's) cosine between the numerics.
   This isolates the numerics: the fused figures of the product come from `gateway eval`
   (docs/evaluation.md, "Embedding precision").

An arm names the numerics as a generation records them: `float32`, `bfloat16` (on the
CPU), `cuda:float32`, `cuda:bfloat16` (on a CUDA device), and for `speed` also
`sentence-transformers` (its float32 on the CPU, the code before). `speed` and `quality`
import neither Tantivy nor LanceDB, so they run on a machine with torch alone (a GPU host).

Usage: python scripts/measure_embedding.py speed|ingest|quality --corpus C [--queries Q
       --qrels R] [--passages N] [--rounds R] [--arms float32,bfloat16]
       [--query-arms float32,int8] [--batch-sizes 16]
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from gateway.embedding import Embedder
from gateway.evaluation.beir import Passage, load_corpus, load_qrels, load_queries
from gateway.evaluation.metrics import ndcg_at, recall_at

ARMS = ("float32", "bfloat16")
REFERENCE = "sentence-transformers"


def embedder_of(arm: str) -> Embedder:
    """`cuda:bfloat16` -> the bfloat16 embedder on the CUDA device; `float32` -> on the CPU."""
    device, _, dtype = arm.rpartition(":")
    return Embedder(precision=dtype, device="cuda" if device == "cuda" else "cpu")  # type: ignore[arg-type]


def texts_of(passages: list[Passage]) -> list[str]:
    return [f"{p.title}\n{p.text}" if p.title else p.text for p in passages]


def speed(passages: list[Passage], rounds: int, arms: list[str], batch_sizes: list[int]) -> None:
    """Each (arm, batch size) once per round, in turn, after one warm-up each."""
    texts = texts_of(passages)
    embed = {}
    for arm in arms:
        if arm == REFERENCE:
            from sentence_transformers import SentenceTransformer

            model = SentenceTransformer(str(Embedder().model_dir), device="cpu")
            for size in batch_sizes:
                embed[(arm, size)] = functools.partial(
                    model.encode, batch_size=size, normalize_embeddings=True
                )
        else:
            embedder = embedder_of(arm)
            for size in batch_sizes:
                embed[(arm, size)] = functools.partial(embedder.embed, batch_size=size)
    for run in embed.values():
        run(texts[:64])  # loaded and warm before any round counts
    rates: dict[tuple[str, int], list[float]] = {key: [] for key in embed}
    for _ in range(rounds):
        for key, run in embed.items():
            started = time.perf_counter()
            run(texts)
            rates[key].append(len(texts) / (time.perf_counter() - started))
    for (arm, size), values in rates.items():
        print(
            f"{arm:22s} batch {size:4d} passages/s: "
            + ", ".join(f"{r:.1f}" for r in values)
            + f"; median {statistics.median(values):.1f}",
            flush=True,
        )


def ingest(passages: list[Passage], rounds: int, arms: list[str]) -> None:
    from gateway.domain import Document, Visibility
    from gateway.ingest.pipeline import ingest_documents
    from gateway.storage.layout import DataLayout

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
    embedders = {arm: embedder_of(arm) for arm in arms}
    for embedder in embedders.values():
        embedder.embed(["warm"])
    rates: dict[str, list[float]] = {arm: [] for arm in arms}
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


def query_vectors(texts: list[str], arm: str, export: Path) -> np.ndarray:
    """`texts` embedded as a server embeds queries: through ONNX, in `arm` (float32 or
    int8), from the float32 `export`."""
    from gateway.embedding.onnx_query import (
        INT8_THREADS,
        OnnxQueryEncoder,
        int8_path,
        quantize_int8,
    )

    embedder = embedder_of("float32")
    if arm == "int8":
        quantize_int8(export, int8_path(export))
        encoder = OnnxQueryEncoder(int8_path(export), embedder, INT8_THREADS, precision="int8")
    else:
        encoder = OnnxQueryEncoder(export, embedder)
    return np.stack([encoder.encode(text) for text in texts])


def quality(
    passages: list[Passage],
    queries_path: Path,
    qrels_path: Path,
    arms: list[str],
    query_arms: list[str],
) -> None:
    """Each arm's passages ranked by each query arm's vectors, and each passage's (query's)
    cosine to the first arm's vector."""
    qrels = load_qrels(qrels_path)
    queries = [q for q in load_queries(queries_path) if q.query_id in qrels]
    ids = [p.doc_id for p in passages]
    texts = texts_of(passages)
    vectors = {}
    for arm in arms:
        embedder = embedder_of(arm)
        started = time.perf_counter()
        vectors[arm] = embedder.embed(texts, batch_size=32)
        print(f"{arm}: {len(texts)} passages in {time.perf_counter() - started:.1f} s", flush=True)
    export = Path(tempfile.mkdtemp(prefix="measure-embedding-")) / "minilm.onnx"
    embedder_of("float32").export_onnx(export)  # one export, made for this run, for every arm
    asked = {arm: query_vectors([q.text for q in queries], arm, export) for arm in query_arms}
    for kind, made in (("passage", vectors), ("query", asked)):
        first = next(iter(made))
        for arm in list(made)[1:]:
            cosines = (made[first] * made[arm]).sum(axis=1)
            print(
                f"{kind} cosine {first}~{arm}: min {cosines.min():.5f}, "
                f"p1 {np.percentile(cosines, 1):.5f}, mean {cosines.mean():.5f}"
            )
    for arm in arms:
        for query_arm, question_vectors in asked.items():
            scores = question_vectors @ vectors[arm].T
            ndcg, recall = [], []
            for row, query in zip(scores, queries, strict=True):
                ranked = [ids[i] for i in np.argsort(-row)[:100]]
                ndcg.append(ndcg_at(ranked, qrels[query.query_id], 10))
                recall.append(recall_at(ranked, qrels[query.query_id], 100))
            print(
                f"passages {arm:14s} queries {query_arm:8s} nDCG@10 {statistics.mean(ndcg):.4f}"
                f"  Recall@100 {statistics.mean(recall):.4f}  ({len(queries)} queries)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("speed", "ingest", "quality"))
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--queries", type=Path)
    parser.add_argument("--qrels", type=Path)
    parser.add_argument("--passages", type=int, default=0, help="the first N; 0: all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--arms", default="", help="comma-separated; default float32,bfloat16")
    parser.add_argument("--query-arms", default="float32,int8", help="comma-separated, for quality")
    parser.add_argument("--batch-sizes", default="16", help="comma-separated, for speed")
    args = parser.parse_args()
    passages = load_corpus(args.corpus)
    if args.passages:
        passages = passages[: args.passages]
    arms = args.arms.split(",") if args.arms else list(ARMS)
    if args.mode == "speed":
        if not args.arms:
            arms.append(REFERENCE)
        speed(passages, args.rounds, arms, [int(b) for b in args.batch_sizes.split(",")])
    elif args.mode == "ingest":
        ingest(passages, args.rounds, arms)
    else:
        if not (args.queries and args.qrels):
            parser.error("quality needs --queries and --qrels")
        quality(passages, args.queries, args.qrels, arms, args.query_arms.split(","))


if __name__ == "__main__":
    main()
