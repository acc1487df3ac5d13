"""Ingestion: parse and validate documents, chunk them, embed them, write one generation."""
