"""Passages embedded in the numerics the hardware offers: chosen as documented, held to the
reference implementation, recorded in the index and shown by /readyz."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from gateway.embedding import Embedder
from gateway.embedding.precision import Numerics, choose, choose_queries, cpu_flags
from gateway.ingest.erasure import erase
from gateway.ingest.pipeline import delete_versions, ingest_paths
from gateway.storage.layout import DataLayout
from tests.helpers.documents import CORPUS, STAFF_EU, write_doc

# Short and long texts in one batch: padding, and truncation at the model's 256 tokens.
TEXTS = [
    "RPL-14",
    "Which rule governs refunds for customers in the EU region?",
    "Refunds are granted within 30 days of purchase. " * 60,
    *(body for _, _, body in CORPUS),
]


def test_auto_takes_bfloat16_only_where_the_cpu_computes_it_natively() -> None:
    assert choose("auto", frozenset({"avx512f", "amx_bf16", "amx_tile"}), cuda=False).dtype == (
        "bfloat16"
    )
    assert choose("auto", frozenset({"avx512_bf16", "avx512_vnni"}), cuda=False).dtype == "bfloat16"
    # VNNI alone (int8) or AVX2 alone: float32.
    assert choose("auto", frozenset({"avx2", "avx512_vnni"}), cuda=False).dtype == "float32"
    assert choose("auto", frozenset(), cuda=False) == Numerics(
        "cpu", "float32", "auto: no native bfloat16 on this CPU"
    )


def test_auto_embeds_queries_in_int8_only_where_the_cpu_has_int8_dot_products() -> None:
    for flags in ({"avx512_vnni"}, {"avx_vnni", "avx2"}, {"amx_int8", "amx_tile"}):
        assert choose_queries("auto", frozenset(flags)).dtype == "int8", flags
    assert choose_queries("auto", frozenset({"avx2", "avx512_bf16"})) == Numerics(
        "cpu", "float32", "auto: no int8 dot products on this CPU"
    )
    # A forced setting keeps queries in float32 (ONNX Runtime has no fast bfloat16 on CPUs).
    for setting in ("float32", "bfloat16"):
        assert choose_queries(setting, frozenset({"avx512_vnni"})).dtype == "float32"


def test_the_setting_forces_float32_whatever_the_hardware() -> None:
    forced = choose("float32", frozenset({"amx_bf16", "avx512_bf16"}), cuda=False)
    assert (forced.device, forced.dtype, forced.label) == ("cpu", "float32", "float32")
    assert choose("auto", frozenset(), cuda=True).label == "cuda:bfloat16"
    assert choose("float32", frozenset(), cuda=True).label == "cuda:float32"


def test_cpu_flags_come_from_proc_cpuinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512_bf16 amx_bf16\n\nflags\t: other\n")
    monkeypatch.setattr("gateway.embedding.precision.CPUINFO", info)
    assert cpu_flags() == {"fpu", "sse2", "avx512_bf16", "amx_bf16"}
    monkeypatch.setattr("gateway.embedding.precision.CPUINFO", tmp_path / "absent")
    assert cpu_flags() == frozenset()


@pytest.fixture(scope="module")
def float32(embedder: Embedder) -> Embedder:
    return Embedder(embedder.model_dir, precision="float32")


@pytest.fixture(scope="module")
def bfloat16(embedder: Embedder) -> Embedder:
    return Embedder(embedder.model_dir, precision="bfloat16")


@pytest.mark.model
def test_float32_vectors_are_sentence_transformers_vectors(float32: Embedder) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(float32.model_dir), device="cpu").encode(
        TEXTS, normalize_embeddings=True, batch_size=16
    )
    ours = float32.embed(TEXTS)
    assert ours.dtype == np.float32 and ours.shape == reference.shape
    assert float((ours * reference).sum(axis=1).min()) > 0.99999


def test_batches_are_made_of_texts_of_like_length_in_word_pieces(float32: Embedder) -> None:
    # Padding costs what a word piece costs, so batches are formed by word pieces, not by
    # characters: a long text of few long words goes with the short texts.
    few_pieces = "information " * 6  # 72 characters, 6 word pieces
    many_pieces = "x y z q w e r t y u"  # 19 characters, 10 word pieces
    short = "RPL"
    texts = [many_pieces, few_pieces, short]
    batches: list[list[int]] = []
    vectors = float32.embed(texts, batch_size=1, progress=lambda rows: batches.append(list(rows)))
    assert batches == [[2], [1], [0]]  # by word pieces; by characters it was 2, 0, 1
    assert np.allclose(vectors, float32.embed(texts, batch_size=3), atol=1e-5)


@pytest.mark.model
def test_bfloat16_passages_rank_as_float32_passages_for_float32_queries(
    float32: Embedder, bfloat16: Embedder
) -> None:
    exact, reduced = float32.embed(TEXTS), bfloat16.embed(TEXTS)
    assert float((exact * reduced).sum(axis=1).min()) > 0.998
    # Queries stay float32 (ONNX in a server): each finds the same best passage whichever
    # numerics embedded them, and no score moves by more than a hundredth (passages whose
    # scores were that close may swap places; the benchmarks' guard is in
    # (docs/evaluation.md, "Embedding precision")).
    questions = ["refund window for EU customers", "RPL-14", "who approves travel"]
    for row in float32.float32_vectors(questions):
        assert int(np.argmax(exact @ row)) == int(np.argmax(reduced @ row))
        assert float(np.abs(exact @ row - reduced @ row).max()) < 0.01


@pytest.mark.model
def test_a_generation_records_the_numerics_of_its_vectors(
    tmp_path: Path, corpus_dir: Path, float32: Embedder, bfloat16: Embedder
) -> None:
    layout = DataLayout(tmp_path / "data")
    ingest_paths([corpus_dir], layout, float32)
    assert layout.open_catalog().current_generation().precisions == "float32"

    later = write_doc(
        tmp_path / "later",
        "new.md",
        {"doc_id": "later-note", **STAFF_EU, "effective_from": "2020-01-01"},
        "A note added after the numerics changed.",
    )
    ingest_paths([later.parent], layout, bfloat16)  # the old vectors stay: the index holds both
    assert layout.open_catalog().current_generation().precisions == "bfloat16,float32"

    # An erasure's generation keeps the vectors that stay, so it keeps their numerics: an
    # operator deciding whether to reindex reads them in /readyz.
    delete_versions(layout, "acme", "later-note")
    assert erase(layout, ann_min_rows=1_000_000).done
    assert layout.open_catalog().current_generation().precisions == "bfloat16,float32"


def test_readiness_names_the_numerics_of_passages_queries_and_index(
    client: TestClient, embedder: Embedder
) -> None:
    body = client.get("/readyz").json()
    assert body["embedding"]["passages"] == embedder.numerics.label
    # Through ONNX, in int8 where this CPU has int8 dot products.
    assert body["embedding"]["queries"] == embedder.query_numerics.dtype
    assert body["embedding"]["index"] == [embedder.numerics.label]
