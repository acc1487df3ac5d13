"""GET /metrics: Prometheus text with the contract's series, counted by route template and
status (refusals before routing included), and nothing in it that names a caller, a
document or what was asked."""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from gateway.telemetry.metrics import Metrics, MetricsMiddleware
from tests.helpers.identity import TokenFactory, bearer

SECRET_QUERY = "zebra-4711 refunds"


def samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def test_metrics_count_requests_stages_and_state(
    client: TestClient, make_token: TokenFactory
) -> None:
    before = samples(client)
    token = bearer(make_token(sub="metrics-subject-9", groups=["staff"]))
    assert client.post("/search", json={"query": SECRET_QUERY}, headers=token).status_code == 200
    assert client.post("/search", json={"query": "x"}).status_code == 401  # before routing
    assert client.get("/documents/no-such-doc", headers=token).status_code == 404
    assert client.get("/nowhere/at-all").status_code == 404
    assert client.put("/search", json={}, headers=token).status_code == 405
    after = samples(client)

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0) - before.get(key, 0)

    assert grew("gateway_requests_total", route="/search", status="200") == 1
    assert grew("gateway_requests_total", route="/search", status="401") == 1
    assert grew("gateway_requests_total", route="/documents/{doc_id}", status="404") == 1
    assert grew("gateway_requests_total", route="unmatched", status="404") == 1
    assert grew("gateway_requests_total", route="/search", status="405") == 1
    assert grew("gateway_request_duration_seconds_count", route="/search") == 3  # 200, 401, 405
    assert grew("gateway_stage_duration_seconds_count", stage="embed_query") >= 1
    assert after[("gateway_index_generation", ())] >= 1
    assert after[("gateway_index_generation_age_seconds", ())] >= 0
    assert ("gateway_ingest_jobs", (("status", "queued"),)) in after
    assert ("gateway_rate_limited_total", ()) in after
    assert after[("gateway_jwks_fetches_total", (("outcome", "ok"),))] >= 1  # the first token's
    assert after[("gateway_jwks_fetches_total", (("outcome", "failed"),))] == 0
    for lane in ("bm25", "dense"):
        assert ("gateway_lane_abandoned_total", (("lane", lane),)) in after
        assert ("gateway_lane_abandoned_running", (("lane", lane),)) in after
    assert ("gateway_policy_reloads_total", (("outcome", "refused"),)) in after
    assert ("gateway_audit_pending", ()) in after

    text = client.get("/metrics").text  # IDs only, and not even those
    for secret in ("zebra", "metrics-subject-9", "no-such-doc", "nowhere", "acme", "refund"):
        assert secret not in text, secret


def test_a_request_is_counted_before_its_last_part_is_sent() -> None:
    """A client holding the whole response finds it counted when it scrapes next; a
    failure counts once, whenever it came."""
    metrics = Metrics()
    routes = [Route("/search", endpoint=PlainTextResponse, methods=["POST"])]

    def counted(status: str) -> float:
        found = metrics.registry.get_sample_value(
            "gateway_requests_total", {"route": "/search", "status": status}
        )
        return found or 0.0

    async def streamed(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b"})

    async def failing(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("before any response")

    async def nothing() -> Message:
        return {"type": "http.disconnect"}

    seen: list[tuple[str, float]] = []

    async def send(message: Message) -> None:
        seen.append((message["type"], counted("200")))

    scope = {"type": "http", "method": "POST", "path": "/search", "root_path": "", "headers": []}
    asyncio.run(MetricsMiddleware(streamed, metrics, routes)(scope, nothing, send))
    assert seen == [
        ("http.response.start", 0.0),
        ("http.response.body", 0.0),  # more to come
        ("http.response.body", 1.0),  # the last part: counted already
    ]
    assert counted("200") == 1.0  # and not again on the way out

    with pytest.raises(RuntimeError):
        asyncio.run(MetricsMiddleware(failing, metrics, routes)(scope, nothing, send))
    assert counted("500") == 1.0
