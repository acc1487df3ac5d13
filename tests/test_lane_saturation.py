"""Late lane work is bounded per tenant: one tenant whose lane calls hang fills its own
slots, and another tenant's search is served whole, under the shipped default policy."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.restriction import Restriction
from gateway.retrieval.budget import BudgetedPool
from gateway.retrieval.lanes.base import LaneResult
from tests.helpers.identity import TokenFactory, bearer, make_settings


@pytest.fixture
def released() -> Iterator[threading.Event]:
    """Set at the end, so that the hung lane calls finish and their threads end."""
    event = threading.Event()
    yield event
    event.set()


def hang_for(tenant: str, client: TestClient, released: threading.Event) -> list[str]:
    """Every lane of the app hangs (until `released`) on a call for `tenant`; returns
    the names of the lanes, as `degraded` lists them."""
    names = []
    for lane in client.app.state.gateway.searcher.lanes:  # type: ignore[attr-defined]
        real = lane.run

        def run(index: Any, restriction: Restriction, *args: Any, real: Any = real) -> LaneResult:
            if restriction.tenant == tenant:
                released.wait(60)
            result: LaneResult = real(index, restriction, *args)
            return result

        lane.run = run
        names.append(lane.name)
    return names


def test_a_tenant_with_its_lanes_saturated_leaves_another_tenant_served_whole(
    data_dir: Path,
    jwks_file: Path,
    embedder: Embedder,
    make_token: TokenFactory,
    released: threading.Event,
) -> None:
    acme = bearer(make_token(sub="ann", tenant="acme", groups=["staff"]))
    globex = bearer(make_token(sub="dave", tenant="globex", groups=["staff"]))
    settings = make_settings(data_dir, jwks_file)  # the shipped default policy
    with TestClient(create_app(settings, embedder=embedder)) as client:
        lanes = hang_for("acme", client, released)
        policy = client.app.state.gateway.policies.current.policy  # type: ignore[attr-defined]
        slots = policy.budgets.max_abandoned_per_lane
        # acme's searches run past every budget, their calls hang on: late work of acme's.
        # (They name an identifier, so that the identifier lane runs too.)
        for _ in range(slots):
            late = client.post("/search", json={"query": "refund RPL-14"}, headers=acme)
            assert late.status_code == 503 and late.json()["code"] == "lanes_unavailable"
        # acme's next search is refused at once: its lanes are saturated.
        skipped = client.post("/search", json={"query": "refund RPL-14"}, headers=acme)
        assert skipped.status_code == 503

        served = client.post("/search", json={"query": "price matching"}, headers=globex)
        assert served.status_code == 200, served.text
        body = served.json()
        assert body["degraded"] == []
        assert [r["doc_id"] for r in body["results"]] == ["globex-pricing"]
        assert body["results"][0]["lanes"]["bm25"] == 1
        assert body["results"][0]["lanes"]["dense"] == 1
        pools = client.app.state.gateway.searcher.pools  # type: ignore[attr-defined]
        assert {pool.name: pool.abandoned_by("acme") for pool in pools} == dict.fromkeys(
            lanes, slots
        )
        assert {pool.name: pool.abandoned_by("globex") for pool in pools} == dict.fromkeys(lanes, 0)


class Served(NamedTuple):
    client: TestClient
    ann: dict[str, str]  # the headers of ann, staff of acme
    exact: Any  # the app's identifier lane, for a test to break
    exact_pool: BudgetedPool


@pytest.fixture
def served(
    data_dir: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> Iterator[Served]:
    """An app on the shipped default policy, with the caller and the lane tests break."""
    ann = bearer(make_token(sub="ann", tenant="acme", groups=["staff"]))
    with TestClient(create_app(make_settings(data_dir, jwks_file), embedder=embedder)) as client:
        searcher = client.app.state.gateway.searcher  # type: ignore[attr-defined]
        (exact,) = [lane for lane in searcher.lanes if lane.name == "exact"]
        (pool,) = [pool for pool in searcher.pools if pool.name == "exact"]
        yield Served(client, ann, exact, pool)


def test_a_query_naming_no_identifier_never_waits_for_the_identifier_lane(
    served: Served, released: threading.Event
) -> None:
    """The identifier lane is answered on the spot for a query that names no identifier:
    with its worker hung, such a search is served whole, and one naming an identifier
    reports the lane degraded."""
    client, ann, exact, pool = served

    def hang(*args: Any) -> LaneResult:
        released.wait(60)
        raise AssertionError("the identifier lane ran for a query without identifiers")

    exact.run = hang
    plain = client.post("/search", json={"query": "refund receipt"}, headers=ann)
    assert plain.status_code == 200, plain.text
    body = plain.json()
    assert body["degraded"] == [] and body["results"]
    assert "exact" in body["timings_ms"]
    assert all(r["lanes"]["exact"] is None for r in body["results"])
    assert pool.abandoned == 0

    coded = client.post("/search", json={"query": "refund RPL-14"}, headers=ann)
    assert coded.status_code == 200, coded.text
    assert coded.json()["degraded"] == ["exact"]
    assert pool.abandoned == 1


def test_a_lane_failing_to_answer_at_once_degrades_that_lane_alone(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    """A failure in a lane's on-the-spot answer is that lane's, like a failure in its run:
    the search is served by the others and names it degraded, not a 500. When only the
    on-the-spot answer fails, the lane's worker still runs it in full."""
    client, ann, exact, _ = served

    def broken(*args: Any) -> LaneResult:  # as a query parser's error quotes the query
        raise ValueError(" ".join(a for a in args if isinstance(a, str)))

    exact.at_once = broken
    ran = client.post("/search", json={"query": "refund RPL-14"}, headers=ann)
    assert ran.status_code == 200, ran.text
    assert ran.json()["degraded"] == []
    assert any(r["lanes"]["exact"] == 1 for r in ran.json()["results"])

    exact.run = broken
    degraded = client.post("/search", json={"query": "refund RPL-14"}, headers=ann)
    assert degraded.status_code == 200, degraded.text
    assert degraded.json()["degraded"] == ["exact"]
    assert degraded.json()["results"]
    logged = [r.getMessage() for r in caplog.records if r.name == "gateway.retrieval"]
    assert any(
        "exact failed to answer at once; its worker runs it: ValueError" in m for m in logged
    )
    assert any("lane exact failed: ValueError" in m for m in logged)
    assert "RPL-14" not in caplog.text  # the exception's message quoted the query
