"""Fast query embeddings: the packaged MiniLM exported to ONNX, run by ONNX Runtime.

The only module importing onnxruntime. One short query through torch costs about 25 ms on
two cores, nearly all of it per-call overhead of small matrix products; ONNX Runtime
computes the same vector in about 11 ms on one core (int8 weights were tried: 10 ms, but
cosine 0.94 to the stored vectors, so no). The export is made from the installed weights
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

from gateway.embedding import Embedder

log = logging.getLogger("gateway.embedding")
PROBE = "Which rule governs refunds for customers in the EU region?"
MIN_AGREEMENT = 0.9999


class OnnxQueryEncoder:
    def __init__(self, path: Path, embedder: Embedder, threads: int = 1) -> None:
        options = ort.SessionOptions()
        # One thread, no spinning: the BM25 lane and the event loop share the other core,
        # and a second ORT thread would fight them for it. Measured over HTTP on SQuAD
        # (top_k 100 by document): p50 34 ms with one thread against 72 ms with two
        # spinning threads and 45 ms with two idle ones, though two win in isolation.
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
            _write_reference(reference, embedder.embed([PROBE])[0])
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
    partial = path.with_suffix(".partial.npy")
    np.save(partial, vector.astype(np.float32), allow_pickle=False)
    os.replace(partial, path)
