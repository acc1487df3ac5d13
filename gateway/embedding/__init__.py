"""The embedding model, one concept in two halves.

`model` holds the packaged all-MiniLM-L6-v2: passage embeddings (torch, loaded on first
use), token counting and query embeddings. `onnx_query` is the fast query path a server
takes: an ONNX Runtime export of the same model, checked against torch before it is used.
Importing this package loads neither torch nor ONNX Runtime.
"""

from gateway.embedding.model import (
    MODEL_NAME,
    Embedder,
    load_cross_encoder,
    pack_vectors,
    unpack_vectors,
)

__all__ = ["MODEL_NAME", "Embedder", "load_cross_encoder", "pack_vectors", "unpack_vectors"]
