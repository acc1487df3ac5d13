"""The dense lane's two engines, exact in memory and LanceDB, rank the same universe alike."""

from __future__ import annotations

from pathlib import Path

import yaml
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.policy.loader import DEFAULT_POLICY_DIR
from tests.conftest import TokenFactory, bearer, make_settings
from tests.test_search_api import ALICE, BOB

QUERIES = ["refund receipt", "how frequently is telecommuting permitted", "gift cards", "MRX"]


def dense_rankings(
    client: TestClient, make_token: TokenFactory, caller: dict[str, object]
) -> list[list[str]]:
    rankings = []
    for query in QUERIES:
        body = {"query": query, "top_k": 100}
        results = client.post("/search", json=body, headers=bearer(make_token(**caller))).json()
        ranked = sorted(
            (r for r in results["results"] if r["lanes"]["dense"]),
            key=lambda r: r["lanes"]["dense"],
        )
        rankings.append([r["chunk_id"] for r in ranked])
    return rankings


def test_flat_and_lancedb_engines_agree(
    tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    policy = yaml.safe_load((DEFAULT_POLICY_DIR / "policy.yaml").read_text())
    policy["retrieval"]["flat_search_max_rows"] = 0  # every universe is "too large": LanceDB
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    spans = InMemorySpanExporter()
    engines = {}
    for name, policy_dir, exporter in (("flat", None, None), ("lancedb", tmp_path, spans)):
        settings = make_settings(data_dir, jwks_file, policy_dir)
        with TestClient(create_app(settings, embedder=embedder, span_exporter=exporter)) as c:
            engines[name] = [dense_rankings(c, make_token, caller) for caller in (ALICE, BOB)]
    assert engines["flat"] == engines["lancedb"]
    assert any(ranking for per_caller in engines["flat"] for ranking in per_caller)
    used = {dict(s.attributes or {}).get("engine") for s in spans.get_finished_spans()}
    assert "lancedb" in used and "flat" not in used
