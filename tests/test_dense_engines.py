"""The dense lane's engines (exact in memory, LanceDB exact, LanceDB ANN) and their choice."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.policy.loader import DEFAULT_POLICY_DIR
from gateway.policy.model import Retrieval
from gateway.retrieval.lanes.dense import DenseLane
from gateway.retrieval.universe import Restriction
from gateway.storage.generations import DataLayout, open_served
from tests.conftest import STAFF_EU, TODAY, TokenFactory, bearer, make_settings
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
    assert "lancedb_exact" in used and "flat" not in used  # no ANN index on a small table


def test_large_universes_use_the_ann_index_small_shares_are_scanned(
    tmp_path: Path, embedder: Embedder
) -> None:
    topics = ["refund", "shipping", "warranty", "loyalty", "returns", "invoices"]
    docs = tmp_path / "docs"
    docs.mkdir()
    lines = []
    for n in range(300):
        acl = ["group:staff"] if n >= 2 else ["group:few"]
        record = {
            "doc_id": f"d{n}",
            "title": f"Note {n}",
            "text": f"Note {n} on {topics[n % len(topics)]} number {n}.",
            **{k: v for k, v in STAFF_EU.items() if k != "acl"},
            "acl": acl,
            "effective_from": "2020-01-01",
        }
        lines.append(json.dumps(record))
    (docs / "notes.jsonl").write_text("\n".join(lines) + "\n")
    layout = DataLayout(tmp_path / "data")
    ingest_paths([docs], layout, embedder, ann_min_rows=256)  # the table gets IVF-PQ
    index = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim)
    assert index is not None and index.vectors.has_ann_index

    everyone = Restriction(
        "acme", frozenset({"group:staff", "group:few"}), frozenset({"EU"}), TODAY
    )
    few = Restriction("acme", frozenset({"group:few"}), frozenset({"EU"}), TODAY)  # 2 of 300
    lane = DenseLane(embedder, Retrieval(flat_search_max_rows=0))
    exact = DenseLane(embedder, Retrieval())  # in memory, exact
    for query in ("refund rules", "warranty number 7"):
        ann = lane.run(index, everyone, query, 10)
        assert ann.details["engine"] == "lancedb_ann"
        # 64 probes cover every partition of this small table: the ANN ranking is exact.
        assert ann.chunk_ids == exact.run(index, everyone, query, 10).chunk_ids
        scanned = lane.run(index, few, query, 10)
        assert scanned.details["engine"] == "lancedb_exact"  # under 1% of the table
        assert sorted(scanned.chunk_ids) == ["d0@1:0", "d1@1:0"]
