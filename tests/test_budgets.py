"""Lane budgets: a lane past its budget is left behind and named; both gone is a 503."""

from __future__ import annotations

from pathlib import Path

import yaml
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.policy.loader import DEFAULT_POLICY_DIR
from tests.conftest import TokenFactory, bearer, make_settings

TOO_SHORT_MS = 0.001  # no thread hop, let alone a model call, finishes in a microsecond


def policy_with_budgets(tmp_path: Path, **budgets: float) -> Path:
    policy = yaml.safe_load((DEFAULT_POLICY_DIR / "policy.yaml").read_text())
    policy["budgets"].update(budgets)
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(policy))
    return tmp_path


def test_lane_past_budget_is_degraded_and_results_still_come(
    tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    settings = make_settings(
        data_dir, jwks_file, policy_with_budgets(tmp_path, dense_ms=TOO_SHORT_MS)
    )
    with TestClient(create_app(settings, embedder=embedder)) as client:
        response = client.post(
            "/search", json={"query": "RPL-14 refund"}, headers=bearer(make_token())
        )
    assert response.status_code == 200
    payload = response.json()
    assert payload["degraded"] == ["dense"]
    assert payload["results"][0]["doc_id"] == "refund-policy"
    assert all(r["lanes"]["dense"] is None for r in payload["results"])


def test_both_lanes_past_budget_is_503_problem(
    tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    policy = policy_with_budgets(tmp_path, dense_ms=TOO_SHORT_MS, bm25_ms=TOO_SHORT_MS)
    with TestClient(create_app(make_settings(data_dir, jwks_file, policy), embedder=embedder)) as c:
        response = c.post("/search", json={"query": "refund"}, headers=bearer(make_token()))
    assert response.status_code == 503
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "lanes_unavailable"


def test_abandoned_lane_work_is_bounded(
    tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    policy = policy_with_budgets(tmp_path, dense_ms=TOO_SHORT_MS, max_inflight_per_lane=1)
    with TestClient(create_app(make_settings(data_dir, jwks_file, policy), embedder=embedder)) as c:
        token = make_token()
        for _ in range(20):  # each abandons a dense call; none may queue behind another
            response = c.post("/search", json={"query": "refund"}, headers=bearer(token))
            assert response.status_code == 200
            assert response.json()["degraded"] == ["dense"]
