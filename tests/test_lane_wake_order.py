"""The dense lane's call is handed to its worker first (`gateway.retrieval.search`,
FIRST_WOKEN): the kernel gives the first woken worker an idle CPU, and the dense lane is
the longest. What the search reports still follows the lanes' own order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.retrieval.lanes.base import LaneResult
from tests.helpers.identity import TokenFactory, bearer, make_settings


def test_the_dense_lane_is_handed_over_first_and_reports_keep_the_lanes_order(
    data_dir: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    ann = bearer(make_token(sub="ann", tenant="acme", groups=["staff"]))
    with TestClient(create_app(make_settings(data_dir, jwks_file), embedder=embedder)) as client:
        lanes = client.app.state.gateway.searcher.lanes  # type: ignore[attr-defined]
        names = [lane.name for lane in lanes]
        assert names.index("bm25") < names.index("dense")  # so the order below is made
        handed: list[str] = []
        for lane in lanes:
            # A lane's call is made, and handed to its worker, right after its answer on
            # the spot was asked for: the order of these questions is the order of waking.
            def at_once(*args: Any, lane: Any = lane, real: Any = lane.at_once) -> Any:
                handed.append(lane.name)
                result: LaneResult | None = real(*args)
                return result

            lane.at_once = at_once

        found = client.post("/search", json={"query": "refund RPL-14"}, headers=ann)
        assert found.status_code == 200, found.text
        assert handed[0] == "dense" and sorted(handed) == sorted(names)

        body = found.json()
        assert body["degraded"] == [] and body["results"]
        lane_stages = [s for s in body["timings_ms"] if s in ("bm25", "embed_query", "exact")]
        assert lane_stages == ["bm25", "embed_query", "exact"]  # the lanes' order
        assert all(list(r["lanes"]) == names for r in body["results"])
