"""Retrieval: restriction, lanes, fusion."""
