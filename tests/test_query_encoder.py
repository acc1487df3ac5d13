"""The ONNX query path computes the model's own vectors, and steps aside when it cannot."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

from gateway.embedding import Embedder
from gateway.embedding.onnx_query import OnnxQueryEncoder, enable_fast_queries

TEXTS = [
    "RPL-14",
    "How quickly are refunds paid to customers in the EU?",
    "émoji 🦜 and accents: façade, naïve",
    "word " * 400,  # beyond the model's 256-token window: truncated the same way
]


def run_cache() -> Path:
    """The run's shared model cache (tests/conftest.py), where the servers' export is."""
    return Path(os.environ["GATEWAY_MODEL_CACHE_DIR"])


@pytest.fixture(scope="module")
def exported(embedder: Embedder) -> Path:
    """The export as servers use it; made here if no app of the run has made it yet."""
    path = run_cache() / f"minilm-{embedder.fingerprint}.onnx"
    if not path.exists():
        embedder.export_onnx(path)
    return path


def test_onnx_vectors_equal_torch_vectors(exported: Path, embedder: Embedder) -> None:
    encoder = OnnxQueryEncoder(exported, embedder)
    for text in TEXTS:
        fast, reference = encoder.encode(text), embedder.float32_vectors([text])[0]
        assert fast.shape == (embedder.dim,) and fast.dtype == np.float32
        assert float(fast @ reference) > 0.9999, text


def test_tokens_are_the_ones_sentence_transformers_feeds_the_model(embedder: Embedder) -> None:
    # The embedder tokenizes without transformers (so a server need not import torch); the
    # model's own tokenizer class, as sentence-transformers loads it, is the reference.
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(embedder.model_dir))
    for text in [
        *TEXTS,
        "word " * 300 + "end",
        "Ünïcode ＦＵＬＬＷＩＤＴＨ 中文 text\tand\u200bzero",
    ]:
        assert embedder.count_tokens(text) == len(reference.tokenize(text)), text
    batch = [TEXTS[1], TEXTS[3], "short"]
    expected = reference(
        batch, padding=True, truncation="longest_first", max_length=embedder.max_tokens,
        return_tensors="np",
    )  # fmt: skip
    features = embedder.features(batch)
    assert features["input_ids"].shape == (3, embedder.max_tokens)  # padded to the longest
    for name, values in features.items():
        assert np.array_equal(values, np.asarray(expected[name])), name


def test_export_is_reused_and_attached(tmp_path: Path, embedder: Embedder) -> None:
    was_fast = embedder.fast_queries
    try:
        assert enable_fast_queries(embedder, tmp_path)
        (exported,) = tmp_path.glob("minilm-*.onnx")
        assert list(tmp_path.glob("minilm-*.probe.npy"))  # torch's answer, kept for restarts
        stamp = exported.stat().st_mtime_ns
        assert enable_fast_queries(embedder, tmp_path)  # the cached export, not a new one
        assert exported.stat().st_mtime_ns == stamp and embedder.fast_queries
    finally:
        if not was_fast:
            embedder.use_fast_queries(None)


def test_a_broken_export_leaves_torch_serving(
    tmp_path: Path, embedder: Embedder, caplog: pytest.LogCaptureFixture
) -> None:
    before = embedder.fast_queries
    (tmp_path / f"minilm-{embedder.fingerprint}.onnx").write_bytes(b"not a model")
    embedder.use_fast_queries(None)
    try:
        with caplog.at_level(logging.WARNING, logger="gateway.embedding"):
            assert enable_fast_queries(embedder, tmp_path) is False
        assert not embedder.fast_queries
        assert any("torch embeds queries" in r.getMessage() for r in caplog.records)
        vector = embedder.embed_query("still answered")
        assert float(vector @ embedder.embed(["still answered"])[0]) > 0.9999
    finally:
        if before:
            enable_fast_queries(embedder, run_cache())
