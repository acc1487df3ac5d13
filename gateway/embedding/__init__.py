"""The embedding model, one concept in two halves.

`model` holds the packaged all-MiniLM-L6-v2: passage embeddings (torch, loaded on first
use), token counting and query embeddings. `onnx_query` is the fast query path a server
takes: an ONNX Runtime export of the same model, checked against torch before it is used.
Importing this package loads neither torch nor ONNX Runtime, nor numpy until a name of
`model` is asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.embedding.model import (
        MODEL_NAME,
        Embedder,
        load_cross_encoder,
        pack_vectors,
        unpack_vectors,
    )

__all__ = ["MODEL_NAME", "Embedder", "load_cross_encoder", "pack_vectors", "unpack_vectors"]


def __getattr__(name: str) -> Any:
    """The model's names load with their first use, not with the package: the settings
    import `gateway.embedding.precision`, and a command such as `gateway db upgrade` has
    no use for numpy and the tokenizer that `model` brings."""
    if name in __all__:
        from gateway.embedding import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
