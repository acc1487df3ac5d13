"""The passage embedder on a CUDA device, held to the float32 CPU embedder.

Runs where torch sees a CUDA device and says so where it does not. It imports nothing
beyond the embedder, so it runs on a GPU host that has torch but none of the engines:
`pytest --noconftest -o addopts= tests/test_embedding_cuda.py` (docs/evaluation.md,
"Embedding precision")."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.embedding import Embedder
from gateway.embedding.precision import cuda_available

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        not cuda_available(), reason="no CUDA device on this machine: the GPU embedder was not run"
    ),
]

# Short and long texts in one batch: padding, and truncation at the model's 256 tokens.
TEXTS = [
    "RPL-14",
    "Which rule governs refunds for customers in the EU region?",
    "Refunds are granted within 30 days of purchase. " * 60,
    "Employees in the EU may carry over five days of leave into the next calendar year.",
    "The incident review names the owner, the timeline and the follow-up actions.",
]


@pytest.fixture(scope="module")
def cpu() -> np.ndarray:
    return Embedder(precision="float32", device="cpu").embed(TEXTS)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_cuda_embedder_matches_the_cpu(cpu: np.ndarray, dtype: str) -> None:
    gpu = Embedder(precision=dtype)  # type: ignore[arg-type]
    assert gpu.numerics.label == f"cuda:{dtype}"  # a CUDA device is taken when present
    vectors = gpu.embed(TEXTS)
    assert vectors.dtype == np.float32 and vectors.shape == cpu.shape
    assert float((vectors * cpu).sum(axis=1).min()) > (0.9999 if dtype == "float32" else 0.998)


def test_auto_takes_the_cuda_device_in_bfloat16() -> None:
    assert Embedder().numerics.label == "cuda:bfloat16"


def test_sentence_vectors_come_from_the_same_pass_on_the_gpu() -> None:
    text = TEXTS[3] + " " + TEXTS[4]
    split = len(TEXTS[3])
    spans = [[(0, split), (split + 1, len(text))]]
    gpu = Embedder(precision="float32")
    whole, sentences = gpu.embed_with_spans([text], spans)
    reference = Embedder(precision="float32", device="cpu").embed_with_spans([text], spans)
    assert float(whole[0] @ reference[0][0]) > 0.9999
    assert np.allclose(sentences[0], reference[1][0], atol=1e-3)
