"""Fast query embeddings: the packaged MiniLM exported to ONNX, run by ONNX Runtime.

The only module importing onnxruntime. One short query through torch costs about 25 ms on
two cores, nearly all of it per-call overhead of small matrix products; ONNX Runtime
computes the same vector in about 9 ms on one core and 6 ms on two (int8 weights were
tried: cosine 0.94 to the stored vectors, so no). The export is made from the installed weights
on first use and kept under the model cache directory; before it serves, its vector for a
probe text must match torch's (cosine at least 0.9999), or torch keeps serving queries.
Torch's probe vector is stored with the export, so later starts need no torch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from gateway.embedding.model import Embedder

log = logging.getLogger("gateway.embedding")
PROBE = "Which rule governs refunds for customers in the EU region?"
MIN_AGREEMENT = 0.9999


# Two threads, no spinning. Alone, a SQuAD question embeds in 9.3 ms on one thread and 5.9
# ms on two. Over HTTP (top_k 100 by document, 3,543 documents, runs alternated): p50 24.0
# -> 21.8 ms, p95 29.0 -> 25.4 ms with one client, and the same 43-45 QPS with eight.
# (An earlier measurement, while the event loop and the BM25 lane did twice the work they
# do now, had two threads losing: 45 against 34 ms.) Spinning threads burn the core the
# other lane and the event loop need: alone a query embeds in 2.4 ms spinning against 3.0,
# but on the 200k bench (runs alternated) /search p95 went from 17.7 to 22.8 ms with one
# client and from 97 to 79 QPS with eight.
QUERY_THREADS = min(2, os.cpu_count() or 1)


class OnnxQueryEncoder:
    def __init__(self, path: Path, embedder: Embedder, threads: int = QUERY_THREADS) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3  # errors only: its warnings are not the operator's
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._features = embedder.features
        self._dim = embedder.dim

    def encode(self, text: str) -> np.ndarray:
        row: np.ndarray = self.encode_many([text])[0]
        return row

    def encode_many(self, texts: Sequence[str]) -> np.ndarray:
        """Unit vectors: mean of the token states over the attention mask, normalised,
        exactly as the sentence-transformers pipeline pools."""
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        features = self._features(texts)
        hidden = self._session.run(None, features)[0]
        mask = features["attention_mask"][..., None].astype(np.float32)
        mean = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
        rows: np.ndarray = mean / np.linalg.norm(mean, axis=1, keepdims=True)
        return rows.astype(np.float32)


def enable_fast_queries(embedder: Embedder, cache_dir: Path) -> bool:
    """Export (once) and attach the ONNX encoder; False, with a log line, when it cannot.

    Torch's vector for the probe is kept beside the export, so that a later start checks
    the export without loading torch at all."""
    path = cache_dir / f"minilm-{embedder.fingerprint}.onnx"
    reference = path.with_suffix(".probe.npy")
    try:
        if not path.exists():
            log.info("exporting the query encoder to %s", path)
            embedder.export_onnx(path)
        if not reference.exists():
            _write_reference(reference, embedder.float32_vectors([PROBE])[0])
        encoder = OnnxQueryEncoder(path, embedder)
        expected = np.load(reference, allow_pickle=False)
        agreement = float(encoder.encode(PROBE) @ expected)
    except Exception as exc:  # any failure leaves the correct, slower torch path serving
        log.warning("fast query encoder unavailable (%s); torch embeds queries", exc)
        return False
    if agreement < MIN_AGREEMENT:
        log.warning("ONNX query vectors differ from torch (cosine %.6f); not used", agreement)
        return False
    embedder.use_fast_queries(encoder)
    return True


def _write_reference(path: Path, vector: np.ndarray) -> None:
    partial = path.with_name(f"{path.stem}.{os.getpid()}.partial.npy")
    np.save(partial, vector.astype(np.float32), allow_pickle=False)
    os.replace(partial, path)
