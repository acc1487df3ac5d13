"""Lane budgets: a lane past its budget is left behind and named; both gone is a 503."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.retrieval.budget import BudgetedPool
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.policies import TOO_SHORT_MS, policy_with_budgets


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
        metrics = client.get("/metrics").text
    assert response.status_code == 200
    assert 'gateway_lane_abandoned_total{lane="dense"} 1.0' in metrics  # an operator sees it
    assert 'gateway_lane_abandoned_total{lane="bm25"} 0.0' in metrics
    payload = response.json()
    assert payload["degraded"] == ["dense"]
    assert payload["results"][0]["doc_id"] == "refund-policy"
    assert all(r["lanes"]["dense"] is None for r in payload["results"])


def test_both_lanes_past_budget_is_503_problem(
    tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    policy = policy_with_budgets(tmp_path, dense_ms=TOO_SHORT_MS, bm25_ms=TOO_SHORT_MS)
    exporter = InMemorySpanExporter()
    settings = make_settings(data_dir, jwks_file, policy)
    with TestClient(create_app(settings, embedder=embedder, span_exporter=exporter)) as c:
        response = c.post("/search", json={"query": "refund"}, headers=bearer(make_token()))
    assert response.status_code == 503
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "lanes_unavailable"
    # A failed request is traced like any other (a successful one is recorded after its
    # response is sent; this one at once), with its error code and the lanes that failed.
    spans = exporter.get_finished_spans()
    root = next(s for s in spans if s.name == "search")
    assert dict(root.attributes or {})["gateway.error_code"] == "lanes_unavailable"
    lanes = {s.name: dict(s.attributes or {}) for s in spans if s.name in ("bm25", "dense")}
    assert {lane: a["degraded"] for lane, a in lanes.items()} == {
        "bm25": "timeout",
        "dense": "timeout",
    }


def test_abandoned_lane_work_is_bounded() -> None:
    release = threading.Event()
    calls: list[int] = []

    def stuck() -> str:
        calls.append(1)
        release.wait(10)
        return "late"

    async def scenario() -> None:
        pool = BudgetedPool("dense", workers=4, max_abandoned=2)
        outcomes = [await pool.run(stuck, budget_s=0.01) for _ in range(5)]
        assert [o.reason for o in outcomes] == ["timeout", "timeout"] + ["saturated"] * 3
        assert len(calls) == 2 and pool.abandoned == 2  # skipped calls never started
        assert (pool.abandoned_total, pool.skipped_total) == (2, 3)
        release.set()
        for _ in range(100):
            if pool.abandoned == 0:
                break
            await asyncio.sleep(0.01)
        assert pool.abandoned == 0
        recovered = await pool.run(lambda: "fresh", budget_s=1.0)
        assert recovered.result == "fresh"
        pool.shutdown()

    asyncio.run(scenario())


def test_late_work_is_counted_per_tenant_and_a_call_that_never_started_never_runs() -> None:
    release = threading.Event()
    ran: list[str] = []

    def stuck(tenant: str) -> Callable[[], str]:
        def call() -> str:
            ran.append(tenant)
            release.wait(10)
            return "late"

        return call

    async def scenario() -> None:
        pool = BudgetedPool("dense", workers=2, max_abandoned=1)
        try:
            first = await pool.run(stuck("a"), budget_s=0.01, tenant="a")
            again = await pool.run(stuck("a"), budget_s=0.01, tenant="a")
            assert (first.reason, again.reason) == ("timeout", "saturated")
            # Tenant a's late call fills a's slot only: b still gets a worker.
            other = await pool.run(stuck("b"), budget_s=0.01, tenant="b")
            assert other.reason == "timeout"
            assert (pool.abandoned_by("a"), pool.abandoned_by("b"), pool.abandoned) == (1, 1, 2)
            # Both workers are held: c's call waits, and is withdrawn when its budget ends.
            queued = await pool.run(stuck("c"), budget_s=0.05, tenant="c")
            assert queued.reason == "timeout" and pool.abandoned_by("c") == 0
            release.set()
            for _ in range(200):
                if pool.abandoned == 0:
                    break
                await asyncio.sleep(0.01)
            assert pool.abandoned == 0
            assert (await pool.run(lambda: "fresh", budget_s=1.0, tenant="c")).result == "fresh"
            assert ran == ["a", "b"]  # c's withdrawn call never ran
        finally:
            release.set()
            pool.shutdown()

    asyncio.run(scenario())


def test_layered_fusion_keeps_the_answering_lane_when_the_other_is_late(
    tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    """`fusion: layered` keeps what both lanes agree on; with the dense lane late, nothing
    can agree, and the query's identifier must not leave only the exact lane's match of
    what BM25 found."""
    import yaml

    policy_dir = policy_with_budgets(tmp_path, dense_ms=TOO_SHORT_MS)
    policy = yaml.safe_load((policy_dir / "policy.yaml").read_text())
    policy["retrieval"]["fusion"] = "layered"
    (policy_dir / "policy.yaml").write_text(yaml.safe_dump(policy))
    settings = make_settings(data_dir, jwks_file, policy_dir)
    with TestClient(create_app(settings, embedder=embedder)) as client:
        found = {}
        for query in ("rule applies RPL-14", "rule applies"):
            response = client.post(
                "/search", json={"query": query, "top_k": 10}, headers=bearer(make_token())
            )
            assert response.status_code == 200
            assert response.json()["degraded"] == ["dense"]
            found[query] = [r["chunk_id"] for r in response.json()["results"]]
    assert len(found["rule applies"]) > 1  # BM25 finds more than the one quoting RPL-14
    assert set(found["rule applies"]) <= set(found["rule applies RPL-14"])


def test_a_cancelled_request_withdraws_its_queued_call_and_counts_its_running_one() -> None:
    """A search cancelled while its lane call waits or runs (its client gone) leaves no
    uncounted work: a queued call never runs, a running one holds its tenant's slot."""
    release = threading.Event()
    ran: list[str] = []

    def stuck(name: str) -> Callable[[], str]:
        def call() -> str:
            ran.append(name)
            release.wait(10)
            return "late"

        return call

    async def scenario() -> None:
        pool = BudgetedPool("dense", workers=1, max_abandoned=1)
        try:
            running = asyncio.create_task(pool.run(stuck("running"), budget_s=5, tenant="a"))
            queued = asyncio.create_task(pool.run(stuck("queued"), budget_s=5, tenant="b"))
            for _ in range(200):
                if ran:
                    break
                await asyncio.sleep(0.01)
            running.cancel()
            queued.cancel()
            for task in (running, queued):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            assert pool.abandoned_by("a") == 1 and pool.abandoned_by("b") == 0
            refused = await pool.run(stuck("refused"), budget_s=5, tenant="a")
            assert refused.reason == "saturated"  # a's slot is held by its running call
            release.set()
            for _ in range(200):
                if pool.abandoned == 0:
                    break
                await asyncio.sleep(0.01)
            assert (await pool.run(lambda: "fresh", budget_s=1.0, tenant="b")).result == "fresh"
            assert ran == ["running"]  # the queued call was withdrawn, never run
        finally:
            release.set()
            pool.shutdown()

    asyncio.run(scenario())
