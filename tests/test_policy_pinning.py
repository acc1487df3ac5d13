"""A request is decided by one policy from the moment it arrives: whether the audit guard
requires its record, the caller, every decision of the route and the version it reports
all come from the policy serving as it arrived, even when a reload lands between the
guard and the route. Here the reload is made to land there for certain, by a middleware
just inside the guard, where a reload by the file watcher or SIGHUP may land by chance."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.api.app import create_app
from gateway.api.audit import AuditMiddleware
from gateway.api.state import AppState
from gateway.embedding import Embedder
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ALICE
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.policies import write_policy

QUERY = "how are refunds paid RPL-14"
VERSION = "Gateway-Policy-Version"


@dataclass
class Landing:
    """What the next request meets as it passes from the audit guard to the route."""

    reload: Callable[[], None] | None = None


class InsideTheGuard:
    def __init__(self, app: ASGIApp, landing: Landing) -> None:
        self.app, self.landing = app, landing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        reload, self.landing.reload = self.landing.reload, None
        if reload is not None and scope["type"] == "http":
            reload()
        await self.app(scope, receive, send)


@dataclass
class Served:
    client: TestClient
    gateway: AppState
    layout: DataLayout
    policy_dir: Path
    landing: Landing

    def reload_as_the_next_request_passes(self, **policy: object) -> None:
        def reload() -> None:
            write_policy(self.policy_dir, **policy)
            assert self.gateway.policies.reload().outcome == "loaded"

        self.landing.reload = reload


@pytest.fixture
def served(tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder) -> Iterator[Served]:
    layout = DataLayout(tmp_path / "data")
    shutil.copytree(data_dir, layout.root)  # its audit table is taken away below
    # A policy requiring no record; no watcher: the reloads are the test's own.
    policy_dir = write_policy(tmp_path / "policy", audit={"required": []})
    settings = make_settings(layout.root, jwks_file, policy_dir).model_copy(
        update={"policy_watch_interval_s": 0.0}
    )
    app = create_app(settings, embedder=embedder)
    landing = Landing()
    classes: list[object] = [m.cls for m in app.user_middleware]
    guard = classes.index(AuditMiddleware)  # the first is the outermost
    app.user_middleware.insert(guard + 1, Middleware(InsideTheGuard, landing=landing))
    with TestClient(app) as client:
        gateway: AppState = client.app.state.gateway  # type: ignore[attr-defined]
        yield Served(client, gateway, layout, policy_dir, landing)


def test_a_reload_after_the_audit_guard_does_not_serve_a_search_its_policy_refuses(
    served: Served, make_token: TokenFactory
) -> None:
    client, gateway = served.client, served.gateway
    alice = bearer(make_token(**ALICE))
    with sqlite3.connect(served.layout.catalog) as db:  # the database refuses every record
        db.execute("ALTER TABLE audit RENAME TO audit_away")
    assert client.get("/documents/refund-policy", headers=alice).status_code == 200
    assert not gateway.audit.flush()  # its record is refused: the trail refuses records now
    arrived_under = gateway.policy.version

    served.reload_as_the_next_request_passes(audit={"required": ["/search"]})
    searched = client.post("/search", json={"query": QUERY}, headers=alice)
    # Decided by the policy it arrived under, which requires no record, and reported so
    # (it was served, yet reported as decided by the new one, which requires a record).
    assert gateway.policy.version != arrived_under
    assert searched.status_code == 200, searched.text
    assert searched.headers[VERSION] == arrived_under

    # The next search is decided by the new policy.
    refused = client.post("/search", json={"query": QUERY}, headers=alice)
    assert refused.status_code == 503 and refused.json()["code"] == "audit_unavailable"
    # The guard's own refusal names the policy that decided it, as every answer does.
    assert refused.headers[VERSION] == gateway.policy.version


def test_readyz_reports_the_policy_it_was_decided_by(served: Served) -> None:
    arrived_under = served.gateway.policy.version
    served.reload_as_the_next_request_passes(retrieval={"candidates_per_lane": 40, "rrf_k": 61})
    ready = served.client.get("/readyz")
    assert served.gateway.policy.version != arrived_under
    assert ready.status_code == 200, ready.text
    assert ready.json()["policy_version"] == ready.headers[VERSION] == arrived_under
