"""Evaluation: BEIR-format retrieval benchmarks and release-gate cases (`gateway eval`)."""
