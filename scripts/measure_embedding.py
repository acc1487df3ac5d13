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
4. `bound`: what the silicon allows. The texts ingest embeds for the first N passages
   (chunks with their title), in its length-sorted batches of 16 (or `--batch-sizes`, a
   line each), counted in padded tokens; the model's arithmetic for them (matrix products
   and attention); the rates this CPU's kernels reach for those two at the model's
   shapes, per arm; and so the fewest seconds embedding can take, beside the seconds it
   took.

An arm names the numerics as a generation records them: `float32`, `bfloat16` (on the
CPU), `cuda:float32`, `cuda:bfloat16` (on a CUDA device), and for `speed` also
`sentence-transformers` (its float32 on the CPU, the code before). `speed` and `quality`
import neither Tantivy nor LanceDB, so they run on a machine with torch alone (a GPU host).

Usage: python scripts/measure_embedding.py speed|ingest|quality|bound --corpus C [--queries Q
       --qrels R] [--passages N] [--rounds R] [--arms float32,bfloat16]
       [--query-arms float32,int8] [--batch-sizes 16]
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gateway.embedding import Embedder
from gateway.evaluation.beir import Passage, load_corpus, load_qrels, load_queries
from gateway.evaluation.metrics import ndcg_at, recall_at

if TYPE_CHECKING:
    from gateway.domain import Document

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
    from gateway.ingest.pipeline import ingest_documents
    from gateway.storage.layout import DataLayout

    documents = ingest_documents_of(passages)
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


def ingest_documents_of(passages: list[Passage]) -> list[Document]:
    """The passages as one tenant's documents, visible to one group, as ingest takes them."""
    from gateway.domain import Document, Visibility

    today = dt.date(2020, 1, 1)
    return [
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


def bound(passages: list[Passage], arms: list[str], batch_sizes: list[int]) -> None:
    """`bound_at` each batch size, the chunks made once."""
    from gateway.ingest.chunk import chunk_document
    from gateway.ingest.encoding import embedded_texts

    embedder = embedder_of(arms[0])
    chunks = [
        chunk
        for document in ingest_documents_of(passages)
        for chunk in chunk_document(document, embedder.count_tokens)
    ]
    texts, spans = embedded_texts(chunks)
    for batch_size in batch_sizes:
        bound_at(embedder, len(passages), texts, spans, arms, batch_size)


def bound_at(
    embedder: Embedder,
    passages: int,
    texts: list[str],
    spans: list[list[tuple[int, int]]],
    arms: list[str],
    batch_size: int,
) -> None:
    """Per arm: the embedding's arithmetic over the rate this CPU computes it at, against
    the time `embed_with_spans` takes for the same chunk texts."""
    model = json.loads((embedder.model_dir / "config.json").read_text())
    hidden, inner, layers = (
        model["hidden_size"],
        model["intermediate_size"],
        model["num_hidden_layers"],
    )
    heads = model["num_attention_heads"]
    # The same batches `embed_with_spans` runs: sorted by word pieces, padded to the longest.
    lengths = embedder.token_counts(texts)
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    shapes = []
    for start in range(0, len(order), batch_size):
        rows = [texts[i] for i in order[start : start + batch_size]]
        shapes.append((len(rows), embedder.features(rows)["input_ids"].shape[1]))
    tokens = sum(b * t for b, t in shapes)
    matmul_flops = sum(
        2 * b * t * (4 * hidden * hidden + 2 * hidden * inner) * layers for b, t in shapes
    )
    attention_flops = sum(4 * b * t * t * hidden * layers for b, t in shapes)
    typical = sorted(t for _, t in shapes)[len(shapes) // 2]
    print(
        f"{len(texts)} chunks of {passages} passages: {tokens / len(texts):.1f} padded "
        f"tokens a chunk (median batch {batch_size} x {typical}); per chunk "
        f"{matmul_flops / len(texts) / 1e9:.3f} GFLOP in matrix products, "
        f"{attention_flops / len(texts) / 1e9:.3f} in attention"
    )
    for arm in arms:
        dtype = arm.rpartition(":")[2]
        gemm, attention = kernel_rates(dtype, batch_size * typical, (hidden, inner), typical, heads)
        fewest = matmul_flops / gemm + attention_flops / attention
        arm_embedder = embedder_of(arm)
        arm_embedder.embed_with_spans(texts[:32], spans[:32])  # loaded and warm
        started = time.perf_counter()
        arm_embedder.embed_with_spans(texts, spans, batch_size)
        took = time.perf_counter() - started
        print(
            f"{arm:9s} matrix products {gemm / 1e9:.0f} GFLOP/s, attention "
            f"{attention / 1e9:.0f} GFLOP/s: at least {fewest:.1f} s "
            f"({len(texts) / fewest:.0f} chunks/s); took {took:.1f} s "
            f"({len(texts) / took:.0f} chunks/s, {fewest / took:.0%} of the bound)",
            flush=True,
        )


def kernel_rates(
    dtype_name: str, rows: int, widths: tuple[int, int], tokens: int, heads: int
) -> tuple[float, float]:
    """FLOP/s this CPU reaches in `dtype_name` (torch's) for the model's larger matrix
    product (`rows` token states, `widths` in and out) and for attention over texts of
    `tokens`."""
    import torch
    from torch.nn import functional as F  # noqa: N812 - torch's own idiom

    hidden, inner = widths
    dtype = getattr(torch, dtype_name)
    x = torch.randn(rows, hidden, dtype=dtype)
    w = torch.randn(inner, hidden, dtype=dtype)
    q = torch.randn(rows // tokens, heads, tokens, hidden // heads, dtype=dtype)
    with torch.inference_mode():
        gemm = _rate(lambda: F.linear(x, w), 2 * rows * hidden * inner)
        attention = _rate(
            lambda: F.scaled_dot_product_attention(q, q, q), 4 * rows * tokens * hidden
        )
    return gemm, attention


def _rate(work: Callable[[], object], flops: float, seconds: float = 1.0) -> float:
    """FLOP/s of `work`, repeated for about `seconds` after a warm-up."""
    work()
    runs, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        work()
        runs += 1
    return flops * runs / elapsed


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
    parser.add_argument("mode", choices=("speed", "ingest", "quality", "bound"))
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--queries", type=Path)
    parser.add_argument("--qrels", type=Path)
    parser.add_argument("--passages", type=int, default=0, help="the first N; 0: all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--arms", default="", help="comma-separated; default float32,bfloat16")
    parser.add_argument("--query-arms", default="float32,int8", help="comma-separated, for quality")
    parser.add_argument("--batch-sizes", default="16", help="comma-separated, for speed and bound")
    args = parser.parse_args()
    passages = load_corpus(args.corpus)
    if args.passages:
        passages = passages[: args.passages]
    arms = args.arms.split(",") if args.arms else list(ARMS)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.mode == "speed":
        if not args.arms:
            arms.append(REFERENCE)
        speed(passages, args.rounds, arms, batch_sizes)
    elif args.mode == "ingest":
        ingest(passages, args.rounds, arms)
    elif args.mode == "bound":
        bound(passages, arms, batch_sizes)
    else:
        if not (args.queries and args.qrels):
            parser.error("quality needs --queries and --qrels")
        quality(passages, args.queries, args.qrels, arms, args.query_arms.split(","))


if __name__ == "__main__":
    main()
