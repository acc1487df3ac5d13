"""Fast query embeddings: the packaged MiniLM exported to ONNX, run by ONNX Runtime.

The only module importing onnxruntime. One short query through torch costs about 25 ms on
two cores, nearly all of it per-call overhead of small matrix products; ONNX Runtime
computes the same vector in about 5 ms on one core and 4 ms on two. The export is made
from the installed weights on first use and kept under the model cache directory; before
it serves, its vector for a probe text must match torch's (cosine at least 0.9999), or
torch keeps serving queries. Torch's probe vector is stored with the export, so later
starts need no torch.

Where `precision.choose_queries` says int8, a second file is derived from the export: its
weight matrices in 8 bits, a scale per block of 128 inputs, multiplied in int8 with the
activations quantised per block as well (MatMulNBits, accuracy level 4). A short query is
bound by reading 42 MB of float32 weights; in 8 bits it embeds in 3.0 ms on one core,
against 3.9 ms (6.4 ms of CPU) for float32 on two and 5.3 ms on one. Its vectors stay
within cosine 0.997 of float32's (2,058 SciFact and SQuAD queries), and dense nDCG@10
within 0.0005 (docs/evaluation.md, "Embedding precision"). One scale per whole activation
tensor (ONNX Runtime's dynamic quantisation) was tried first: cosine 0.94-0.99, outside
the guard. It must agree with the probe at cosine 0.995, or float32 serves.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from gateway.embedding.model import Embedder
from gateway.placement import usable_cpus

if TYPE_CHECKING:
    import onnx

log = logging.getLogger("gateway.embedding")
PROBE = "Which rule governs refunds for customers in the EU region?"
MIN_AGREEMENT = {"float32": 0.9999, "int8": 0.995}
INT8_BLOCK = 128  # inputs per scale: 64 drifted less (cosine 0.9994) but ran 15% slower


# Two threads, no spinning. Alone, a SQuAD question embeds in 9.3 ms on one thread and 5.9
# ms on two. Over HTTP (top_k 100 by document, 3,543 documents, runs alternated): p50 24.0
# -> 21.8 ms, p95 29.0 -> 25.4 ms with one client, and the same 43-45 QPS with eight.
# (An earlier measurement, while the event loop and the BM25 lane did twice the work they
# do now, had two threads losing: 45 against 34 ms.) Spinning threads burn the core the
# other lane and the event loop need: alone a query embeds in 2.4 ms spinning against 3.0,
# but on the 200k bench (runs alternated) /search p95 went from 17.7 to 22.8 ms with one
# client and from 97 to 79 QPS with eight.
QUERY_THREADS = 2  # at most; see `query_threads`
# But no more than the dense lane's own CPUs where it has some (`GATEWAY_LANE_CPUS=split`,
# which `auto` takes on two CPUs): ONNX Runtime's second thread runs anywhere, so there it
# took turns with the BM25 lane on the other CPU. On a two-CPU AVX2 machine (float32
# queries: no int8 dot products), the 200k bench with one thread against two, three
# alternated rounds: p95 18.8 / 18.6 / 20.2 against 22.5 / 20.2 / 25.4 ms at one client,
# 74.9 / 73.7 / 73.8 against 61.9 / 71.1 / 59.6 QPS at eight, 21 against 24 ms of server
# CPU a search; BM25's stage 6.2 against 8.9 ms, the query's embedding 7.2 either way.
# Where BM25 is light and queries longer (SciFact's claims, 22 word pieces against the
# bench's 14; 23,677 chunks), one thread cost latency at one client: p95 33.8 / 37.7
# against 30.0 / 35.1 ms by document, two runs of 520. Kept for the CPU it saves a search.
# int8 on one thread: a second makes a lone query faster (2.4 against 3.0 ms) for 0.6 ms
# more CPU, but on the 200k bench it left /search's p50 as it was (12.4 against 12.3 ms)
# and cost 1.3 ms of CPU a request and 6 of 110 QPS at eight clients.
INT8_THREADS = 1


class OnnxQueryEncoder:
    def __init__(
        self,
        path: Path,
        embedder: Embedder,
        threads: int | None = None,
        precision: str = "float32",
    ) -> None:
        self.precision = precision  # what `path` holds: "float32" or "int8"
        self.threads = query_threads() if threads is None else threads
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
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


def query_threads(cpus: Collection[int] | None = None) -> int:
    """ONNX Runtime's threads for float32 queries: QUERY_THREADS, but no more than `cpus`,
    those the dense lane runs on: its own where it has some, by default every one this
    process may use (`usable_cpus`)."""
    if cpus is None:
        cpus = usable_cpus() or range(os.cpu_count() or 1)
    return max(1, min(QUERY_THREADS, len(cpus)))


def enable_fast_queries(embedder: Embedder, cache_dir: Path, threads: int | None = None) -> bool:
    """Export (once) and attach the ONNX encoder, in int8 where `embedder.query_numerics`
    says so and that works (on INT8_THREADS), else in float32 (on `threads`, by default
    `query_threads()`); False, with a log line, when neither can.

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
        expected = np.load(reference, allow_pickle=False)
        encoder = None
        if embedder.query_numerics.dtype == "int8":
            encoder = _agreeing(_int8_encoder(path, embedder), expected)
        encoder = encoder or _agreeing(OnnxQueryEncoder(path, embedder, threads), expected)
    except Exception as exc:  # any failure leaves the correct, slower torch path serving
        log.warning("fast query encoder unavailable (%s); torch embeds queries", exc)
        return False
    if encoder is None:
        return False
    embedder.use_fast_queries(encoder)
    return True


def int8_path(path: Path) -> Path:
    """Where the int8 encoder derived from the float32 export at `path` is kept."""
    return path.with_suffix(".int8.onnx")


def _int8_encoder(path: Path, embedder: Embedder) -> OnnxQueryEncoder | None:
    """The int8 encoder, derived from the float32 export once; None (float32 serves) when
    this ONNX Runtime cannot make or run it."""
    quantized = int8_path(path)
    try:
        if not quantized.exists():
            log.info("deriving the int8 query encoder %s", quantized)
            quantize_int8(path, quantized)
        return OnnxQueryEncoder(quantized, embedder, INT8_THREADS, precision="int8")
    except Exception as exc:
        log.warning("int8 query encoder unavailable (%s); float32 embeds queries", exc)
        return None


def _agreeing(encoder: OnnxQueryEncoder | None, expected: np.ndarray) -> OnnxQueryEncoder | None:
    """`encoder`, if its vector for the probe matches torch's float32 one closely enough
    for its numerics."""
    if encoder is None:
        return None
    agreement = float(encoder.encode(PROBE) @ expected)
    if agreement < MIN_AGREEMENT[encoder.precision]:
        log.warning(
            "%s ONNX query vectors differ from torch (cosine %.6f); not used",
            encoder.precision,
            agreement,
        )
        return None
    return encoder


def quantize_int8(source: Path, target: Path) -> None:
    """`source`'s weight matrices in 8 bits, a scale per block of INT8_BLOCK inputs, to be
    multiplied in int8 (accuracy level 4); written atomically."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    # It logs a line per node at INFO; an operator needs none of them.
    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    model = onnx.load(str(source))
    _constants_to_initializers(model)
    quantizer = MatMulNBitsQuantizer(
        model, bits=8, block_size=INT8_BLOCK, is_symmetric=True, accuracy_level=4
    )
    quantizer.process()
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    quantizer.model.save_model_to_file(str(partial), use_external_data_format=False)
    os.replace(partial, target)


def _constants_to_initializers(model: onnx.ModelProto) -> None:
    """torch's exporter writes the weights as Constant nodes; the quantizer rewrites only
    matrix products whose weights are initializers."""
    kept = []
    for node in model.graph.node:
        attribute = node.attribute[0] if len(node.attribute) == 1 else None
        if node.op_type == "Constant" and attribute is not None and attribute.name == "value":
            tensor = attribute.t
            tensor.name = node.output[0]
            model.graph.initializer.append(tensor)
        else:
            kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)


def _write_reference(path: Path, vector: np.ndarray) -> None:
    partial = path.with_name(f"{path.stem}.{os.getpid()}.partial.npy")
    np.save(partial, vector.astype(np.float32), allow_pickle=False)
    os.replace(partial, path)
