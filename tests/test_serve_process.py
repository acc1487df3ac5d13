"""`gateway serve` as a real process on loopback: readiness, search, big headers."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import AUDIENCE, ISSUER, TokenFactory, bearer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(data_dir: Path, jwks_file: Path) -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "GATEWAY_DATA_DIR": str(data_dir),
        "GATEWAY_OIDC_ISSUER": ISSUER,
        "GATEWAY_OIDC_AUDIENCE": AUDIENCE,
        "GATEWAY_JWKS_URI": jwks_file.as_uri(),
        "HF_HUB_OFFLINE": "1",
    }
    exe = shutil.which("gateway", path=str(Path(sys.executable).parent)) or "gateway"
    process = subprocess.Popen(
        [exe, "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"server exited: {process.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        else:
            pytest.fail("server not ready in 120 s")
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)
        if process.stderr:
            process.stderr.close()


def test_search_over_real_http(server: str, make_token: TokenFactory) -> None:
    response = httpx.post(
        f"{server}/search", json={"query": "RPL-14"}, headers=bearer(make_token()), timeout=30
    )
    assert response.status_code == 200
    assert response.json()["results"][0]["doc_id"] == "refund-policy"


def test_a_32_kib_token_reaches_authentication(server: str) -> None:
    response = httpx.post(
        f"{server}/search", json={"query": "x"}, headers=bearer("a" * 32 * 1024), timeout=30
    )
    assert response.status_code == 401
