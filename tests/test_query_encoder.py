"""The ONNX query path computes the model's own vectors, and steps aside when it cannot."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

from gateway.embedding import Embedder
from gateway.embedding.onnx_query import (
    INT8_THREADS,
    OnnxQueryEncoder,
    enable_fast_queries,
    int8_path,
    quantize_int8,
)
from gateway.embedding.precision import Numerics
from tests.helpers.documents import CORPUS

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
    for text in batch:  # one text, as a query is tokenised (another call, see features)
        alone = reference(
            [text], padding=True, truncation="longest_first", max_length=embedder.max_tokens,
            return_tensors="np",
        )  # fmt: skip
        for name, values in embedder.features([text]).items():
            assert np.array_equal(values, np.asarray(alone[name])), (name, text[:20])


def test_export_is_reused_and_attached(tmp_path: Path, embedder: Embedder) -> None:
    was_fast = embedder.fast_queries
    try:
        assert enable_fast_queries(embedder, tmp_path)
        exported = tmp_path / f"minilm-{embedder.fingerprint}.onnx"
        derived = [p for p in (exported, int8_path(exported)) if p.exists()]
        assert exported in derived
        assert list(tmp_path.glob("minilm-*.probe.npy"))  # torch's answer, kept for restarts
        stamps = [p.stat().st_mtime_ns for p in derived]
        assert enable_fast_queries(embedder, tmp_path)  # the cached files, not new ones
        assert [p.stat().st_mtime_ns for p in derived] == stamps and embedder.fast_queries
    finally:
        if not was_fast:
            embedder.use_fast_queries(None)


@pytest.fixture(scope="module")
def int8_encoder(
    exported: Path, embedder: Embedder, tmp_path_factory: pytest.TempPathFactory
) -> OnnxQueryEncoder:
    """The int8 encoder derived from the export, whatever this CPU's flags."""
    target = tmp_path_factory.mktemp("int8") / "minilm.int8.onnx"
    quantize_int8(exported, target)
    return OnnxQueryEncoder(target, embedder, INT8_THREADS, precision="int8")


def test_int8_query_vectors_stay_close_to_float32_and_rank_alike(
    int8_encoder: OnnxQueryEncoder, embedder: Embedder
) -> None:
    for text in TEXTS:
        quick, reference = int8_encoder.encode(text), embedder.float32_vectors([text])[0]
        assert quick.shape == (embedder.dim,) and quick.dtype == np.float32
        assert float(quick @ reference) > 0.995, text
    # Each question finds the passage a float32 query finds (some passages are versions
    # of one another, so not always its own).
    passages = [body for _, _, body in CORPUS]
    stored = embedder.float32_vectors(passages)
    for body in passages:
        question = " ".join(body.split()[:12])
        found = int(np.argmax(stored @ int8_encoder.encode(question)))
        assert found == int(np.argmax(stored @ embedder.float32_vectors([question])[0])), question


def _copy_of_cache(tmp_path: Path, exported: Path) -> Path:
    """A cache dir holding the run's float32 export and probe (linked, not copied)."""
    for source in (exported, exported.with_suffix(".probe.npy")):
        (tmp_path / source.name).symlink_to(source)
    return tmp_path


def test_the_float32_setting_keeps_queries_in_float32(
    tmp_path: Path, embedder: Embedder, exported: Path
) -> None:
    forced = Embedder(embedder.model_dir, precision="float32")
    cache = _copy_of_cache(tmp_path, exported)
    assert forced.query_numerics.dtype == "float32"
    assert enable_fast_queries(forced, cache) and forced.queries_label == "float32"
    assert not int8_path(cache / exported.name).exists()  # nothing derived for it


def test_a_broken_int8_encoder_leaves_float32_serving(
    tmp_path: Path,
    embedder: Embedder,
    exported: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        "gateway.embedding.model.choose_queries",
        lambda setting: Numerics("cpu", "int8", "auto: test"),
    )
    wanting = Embedder(embedder.model_dir)
    cache = _copy_of_cache(tmp_path, exported)
    int8_path(cache / exported.name).write_bytes(b"not a model")
    with caplog.at_level(logging.WARNING, logger="gateway.embedding"):
        assert enable_fast_queries(wanting, cache)
    assert wanting.queries_label == "float32"
    assert any("float32 embeds queries" in r.getMessage() for r in caplog.records)
    text = "still answered"
    assert float(wanting.embed_query(text) @ embedder.float32_vectors([text])[0]) > 0.9999


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
