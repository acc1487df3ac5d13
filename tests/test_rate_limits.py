"""The policy's `limits`: token buckets per subject and per tenant on every protected route,
429 `rate_limited` with `Retry-After` beyond them, counted in /metrics, and a caller's
flood never spends another tenant's budget."""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.api.ratelimit import RateLimiter, SharedRateLimiter
from gateway.domain import Caller
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.policy.model import Limits
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.policies import write_policy

# Slow refills, so that the test's own duration adds no token.
LIMITS = {
    "per_subject": {"rate_per_s": 0.01, "burst": 3},
    "per_tenant": {"rate_per_s": 0.01, "burst": 5},
}


@pytest.fixture
def limited(
    tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder
) -> Iterator[TestClient]:
    settings = make_settings(data_dir, jwks_file, write_policy(tmp_path / "policy", limits=LIMITS))
    with TestClient(create_app(settings, embedder=embedder)) as client:
        yield client


def search(client: TestClient, token: str) -> int:
    return client.post("/search", json={"query": "refunds"}, headers=bearer(token)).status_code


def test_a_subject_beyond_its_burst_is_429_with_retry_after(
    limited: TestClient, make_token: TokenFactory
) -> None:
    ann = make_token(sub="ann", groups=["staff"])
    began = time.monotonic()
    assert [search(limited, ann) for _ in range(3)] == [200, 200, 200]
    refused = limited.post("/search", json={"query": "refunds"}, headers=bearer(ann))
    took = time.monotonic() - began
    assert refused.status_code == 429
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["code"] == "rate_limited"
    # One token at 0.01/s, less what refilled while the burst was served (a second or more
    # on a slow machine's first searches).
    assert math.ceil(100 - took) <= int(refused.headers["retry-after"]) <= 100
    assert limited.get("/documents/refund-policy", headers=bearer(ann)).status_code == 429
    # Other subjects of the tenant have budgets of their own, within the tenant's (5): a
    # refused request takes nothing, so two more get through and a third does not.
    assert search(limited, make_token(sub="bob", groups=["staff"])) == 200
    assert search(limited, make_token(sub="cy", groups=["staff"])) == 200
    assert search(limited, make_token(sub="dan", groups=["staff"])) == 429
    # Another tenant is untouched by all of it.
    assert search(limited, make_token(sub="eve", tenant="globex", groups=["staff"])) == 200
    metrics = limited.get("/metrics").text
    assert "gateway_rate_limited_total 3.0" in metrics


def test_no_limits_means_unlimited(client: TestClient, make_token: TokenFactory) -> None:
    ann = make_token(sub="ann-unlimited", groups=["staff"])
    assert {search(client, ann) for _ in range(20)} == {200}


def caller(subject: str, tenant: str = "acme") -> Caller:
    return Caller(subject, tenant, "EU", frozenset(), frozenset())


def admitted(limiter: RateLimiter | SharedRateLimiter, who: Caller, limits: Limits) -> bool:
    try:
        limiter.admit(who, limits)
    except GatewayError as exc:
        assert exc.code == "rate_limited"
        return False
    return True


@pytest.mark.sleeps
@pytest.mark.parametrize("kind", ["process", "shared"])
def test_both_limiters_keep_the_same_buckets(kind: str, tmp_path: Path) -> None:
    """The buckets a `serve --processes N` shares in SQLite admit what one process's do."""
    limiter = RateLimiter() if kind == "process" else SharedRateLimiter(tmp_path / "l.db")
    limits = Limits.model_validate(LIMITS)
    ann, bob, cy, dan = (caller(name) for name in ("ann", "bob", "cy", "dan"))
    assert [admitted(limiter, ann, limits) for _ in range(4)] == [True, True, True, False]
    assert [admitted(limiter, who, limits) for who in (bob, cy, dan)] == [True, True, False]
    assert admitted(limiter, caller("eve", tenant="globex"), limits)
    fast = Limits.model_validate({"per_subject": {"rate_per_s": 50, "burst": 1}})
    fay = caller("fay")
    assert admitted(limiter, fay, fast) and not admitted(limiter, fay, fast)
    time.sleep(0.05)  # 2.5 tokens' time, one token held
    assert admitted(limiter, fay, fast) and not admitted(limiter, fay, fast)


def test_two_processes_buckets_in_one_file_are_one_set(tmp_path: Path) -> None:
    first, second = (SharedRateLimiter(tmp_path / "limits.db") for _ in range(2))
    limits = Limits.model_validate(LIMITS)
    ann = caller("ann")
    assert [admitted(first, ann, limits), admitted(second, ann, limits)] == [True, True]
    assert [admitted(second, ann, limits), admitted(first, ann, limits)] == [True, False]


@pytest.mark.sleeps
def test_full_buckets_leave_the_shared_file(tmp_path: Path) -> None:
    limiter = SharedRateLimiter(tmp_path / "limits.db")
    limiter.PRUNE_EVERY = 10
    fast = Limits.model_validate({"per_subject": {"rate_per_s": 1000, "burst": 1}})
    for n in range(9):
        assert admitted(limiter, caller(f"caller-{n}"), fast)
    time.sleep(0.01)  # every bucket full again
    assert admitted(limiter, caller("the-tenth"), fast)  # prunes
    with sqlite3.connect(tmp_path / "limits.db") as db:
        (kept,) = db.execute("SELECT key FROM buckets").fetchall()
    assert kept[0].endswith("the-tenth")


def test_many_connections_at_once_admit_exactly_the_burst(tmp_path: Path) -> None:
    """Four limiters on one file (as four processes have), 100 requests each at once, one
    bucket of 150: exactly 150 admitted, whatever the interleaving."""
    limits = Limits.model_validate({"per_subject": {"rate_per_s": 0.001, "burst": 150}})
    limiters = [SharedRateLimiter(tmp_path / "limits.db") for _ in range(4)]
    ann = caller("ann")

    def hundred(limiter: SharedRateLimiter) -> int:
        return sum(admitted(limiter, ann, limits) for _ in range(100))

    with ThreadPoolExecutor(4) as pool:
        assert sum(pool.map(hundred, limiters)) == 150


def test_a_limits_file_held_by_another_is_503_not_a_free_pass(tmp_path: Path) -> None:
    limiter = SharedRateLimiter(tmp_path / "limits.db")
    limits = Limits.model_validate(LIMITS)
    holder = sqlite3.connect(tmp_path / "limits.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        began = time.monotonic()
        with pytest.raises(GatewayError) as refused:
            limiter.admit(caller("ann"), limits)
        assert refused.value.code == "not_ready"
        assert refused.value.headers == {"Retry-After": "1"}
        assert time.monotonic() - began < 2  # the event loop waited 0.2 s, not 10
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert admitted(limiter, caller("ann"), limits)  # nothing was left half done
