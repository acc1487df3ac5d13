"""A real `gateway serve` stays responsive while a tenant admin floods the policy preview:
eight concurrent previews of a 380 KB policy once held every thread of the default pool,
and `/readyz` took 56 s."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.helpers.callers import ROOT
from tests.helpers.identity import AUDIENCE, ISSUER, TokenFactory, bearer
from tests.helpers.policies import write_policy
from tests.helpers.processes import gateway_env, running_server

pytestmark = pytest.mark.server


def test_health_and_readiness_answer_while_previews_run(
    tmp_path: Path, data_dir: Path, jwks_file: Path, make_token: TokenFactory
) -> None:
    env = gateway_env(
        GATEWAY_DATA_DIR=str(data_dir),
        GATEWAY_POLICY_DIR=str(write_policy(tmp_path / "policy")),
        GATEWAY_POLICY_WATCH_INTERVAL_S="0",
        GATEWAY_OIDC_ISSUER=ISSUER,
        GATEWAY_OIDC_AUDIENCE=AUDIENCE,
        GATEWAY_JWKS_URI=jwks_file.as_uri(),
    )
    lines = (f"- {{group: g{i}, grants: [p:{i}]}}\n" for i in range(12_000))
    body = {"files": {"policy.yaml": "grants:\n" + "".join(lines)}}  # 380 KB
    headers = bearer(make_token(**ROOT))
    with running_server(env) as (base, _):

        def flood(_: int) -> int:
            with httpx.Client(base_url=base, timeout=300) as client:
                return client.post("/admin/policy/preview", json=body, headers=headers).status_code

        probes: list[tuple[str, int, float]] = []
        done = threading.Event()

        def probe() -> None:
            with httpx.Client(base_url=base, timeout=300) as client:
                while not done.is_set():
                    for path in ("/healthz", "/readyz"):
                        started = time.monotonic()
                        status = client.get(path).status_code
                        probes.append((path, status, time.monotonic() - started))
                    time.sleep(0.05)

        prober = threading.Thread(target=probe)
        prober.start()
        try:
            with ThreadPoolExecutor(8) as pool:
                statuses = list(pool.map(flood, range(8)))
        finally:
            done.set()
            prober.join()

    # One preview of the tenant ran (and was over the grants bound); the rest were turned
    # away at once, not queued behind it.
    assert set(statuses) <= {422, 429} and 429 in statuses, statuses
    assert {path for path, _, _ in probes} == {"/healthz", "/readyz"}
    assert all(status == 200 for _, status, _ in probes), probes
    slowest = max(seconds for _, _, seconds in probes)
    assert slowest < 3.0, f"a health probe took {slowest:.1f} s while previews ran"
