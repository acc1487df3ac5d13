"""Answering: evidence assembly under a token budget, extractive answers, abstention."""
