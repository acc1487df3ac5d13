"""Retrieval lanes: each ranks the restricted universe on its own engine."""
