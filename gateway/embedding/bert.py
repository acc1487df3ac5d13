"""The packaged MiniLM's transformer, as a few torch operations over its own weights.

Why not transformers or sentence-transformers: importing them costs 4-5 s per process
(configuration machinery, scikit-learn) on top of torch's 1.3 s, for a six-layer BERT whose
forward pass is a dozen lines; and the precision each matrix product runs in is ours to
choose (`gateway.embedding.precision`). tests/test_embedding_precision.py holds it to
sentence-transformers' own vectors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch.nn import functional as F  # noqa: N812 - torch's own idiom


class Bert:
    """A BERT encoder (absolute positions, GELU, post-layer-norm) in inference mode.

    `dtype` is what the weights and activations are held in; layer norms and the softmax
    run in float32 whatever it is (torch upcasts them internally for bfloat16)."""

    def __init__(self, model_dir: Path, dtype: torch.dtype, device: str = "cpu") -> None:
        config: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
        if config.get("model_type") != "bert" or config.get("hidden_act") != "gelu":
            raise ValueError(f"{model_dir} is not a BERT model with GELU activations")
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config["layer_norm_eps"])
        self.dtype = dtype
        self.device = device
        weights = load_file(str(model_dir / "model.safetensors"), device=device)
        self._w = {
            name.removeprefix("bert."): tensor.to(dtype)
            for name, tensor in weights.items()
            if tensor.is_floating_point()
        }

    def __call__(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        """Last hidden states, (batch, tokens, hidden), in float32 on the CPU. Callers run
        it under `torch.inference_mode()` (or trace it for export)."""
        w = self._w
        input_ids = input_ids.to(self.device)
        token_type_ids = token_type_ids.to(self.device)
        positions = torch.arange(input_ids.shape[1], device=self.device)
        x = (
            w["embeddings.word_embeddings.weight"][input_ids]
            + w["embeddings.token_type_embeddings.weight"][token_type_ids]
            + w["embeddings.position_embeddings.weight"][positions]
        )
        x = self._norm(x, "embeddings.LayerNorm")
        # Padding keys are left out of the softmax: a boolean mask, True where attended.
        keep = attention_mask.to(self.device, torch.bool)[:, None, None, :]
        for i in range(self.layers):
            x = self._layer(x, keep, f"encoder.layer.{i}.")
        return x.float().cpu()

    def _layer(self, x: torch.Tensor, keep: torch.Tensor, at: str) -> torch.Tensor:
        batch, tokens, hidden = x.shape

        def heads(name: str) -> torch.Tensor:
            projected = self._linear(x, at + f"attention.self.{name}")
            return projected.view(batch, tokens, self.heads, -1).transpose(1, 2)

        context = F.scaled_dot_product_attention(
            heads("query"), heads("key"), heads("value"), attn_mask=keep
        )
        context = context.transpose(1, 2).reshape(batch, tokens, hidden)
        attended = self._linear(context, at + "attention.output.dense") + x
        x = self._norm(attended, at + "attention.output.LayerNorm")
        inner = F.gelu(self._linear(x, at + "intermediate.dense"))
        return self._norm(self._linear(inner, at + "output.dense") + x, at + "output.LayerNorm")

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, self._w[name + ".weight"], self._w[name + ".bias"])

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        # The width as a constant, not x.shape: an ONNX export needs it static.
        return F.layer_norm(
            x, (self.hidden,), self._w[name + ".weight"], self._w[name + ".bias"], self.eps
        )
