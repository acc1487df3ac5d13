"""Real `gateway` processes for tests: a server on loopback, and commands run to completion."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest


def gateway_exe() -> str:
    return shutil.which("gateway", path=str(Path(sys.executable).parent)) or "gateway"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gateway_env(**settings: str) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", **settings}


@contextmanager
def running_server(env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`gateway serve` on a free loopback port, ready when this yields."""
    port = free_port()
    process = subprocess.Popen(
        [gateway_exe(), "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if process.poll() is not None:
                assert process.stderr is not None
                pytest.fail(f"server exited: {process.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        else:
            pytest.fail("server not ready in 120 s")
        yield base, process
    finally:
        process.terminate()
        process.wait(timeout=30)
        if process.stderr:
            process.stderr.close()


def run_gateway(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [gateway_exe(), *args], env=env, capture_output=True, text=True, timeout=300
    )
