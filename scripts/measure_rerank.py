"""Measure the cross-encoder rerank stage's latency for 20 and 50 candidates.

Usage: python scripts/measure_rerank.py [--rounds N]
No trained cross-encoder can be installed here, so this builds one from the packaged
MiniLM weights (an untrained classification head: latency is real, rankings are not) and
times `load_cross_encoder`'s scorer on SQuAD paragraphs, as the rerank stage calls it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from gateway.embedding import Embedder, load_cross_encoder

SQUAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad2-dev"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    import torch
    from sentence_transformers import CrossEncoder

    torch.manual_seed(0)
    embedder = Embedder()
    with tempfile.TemporaryDirectory() as tmp:
        CrossEncoder(str(embedder.model_dir), num_labels=1, device="cpu").save(tmp)
        score = load_cross_encoder(Path(tmp))
        passages = [json.loads(line)["text"] for line in (SQUAD / "passages.jsonl").open()]
        # What the stage really reorders: chunks of the default size (96 word pieces), here
        # the first ~70 words of each paragraph; whole paragraphs for comparison.
        chunks = [" ".join(p.split()[:70]) for p in passages]
        query = "What is the name of the region the Normans gave their name to?"
        for label, texts in (("chunks", chunks), ("paragraphs", passages)):
            for candidates in (20, 50):
                pairs = [(query, text) for text in texts[:candidates]]
                pieces = statistics.mean(embedder.count_tokens(t) for _q, t in pairs)
                score(pairs)  # warm
                times = []
                for _ in range(args.rounds):
                    started = time.perf_counter()
                    score(pairs)
                    times.append((time.perf_counter() - started) * 1000)
                print(
                    f"rerank {candidates} {label} (~{pieces:.0f} word pieces each): "
                    f"p50 {statistics.median(times):.0f} ms, max {max(times):.0f} ms"
                )


if __name__ == "__main__":
    main()
