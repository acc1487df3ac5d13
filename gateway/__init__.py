"""Permission-aware enterprise RAG gateway."""

__version__ = "0.1.0"
