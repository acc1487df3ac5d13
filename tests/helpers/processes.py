"""Real `gateway` processes for tests: a server on loopback, and commands run to completion."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest

from gateway.bench.server import free_port, gateway_command

# The `reap` fixture (tests/conftest.py): registers a process to kill at teardown.
Reap = Callable[[subprocess.Popen[bytes]], subprocess.Popen[bytes]]


def gateway_env(**settings: str) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", **settings}


def wait_until_ready(process: subprocess.Popen[bytes], url: str, seconds: float = 120) -> None:
    """Until `url` answers 200; fails the test if the process exits or time runs out."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            said = process.stderr.read().decode()[-2000:] if process.stderr else ""
            pytest.fail(f"{process.args!r} exited: {said}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    pytest.fail(f"{url} not ready in {seconds:.0f} s")


@contextmanager
def running_server(
    env: dict[str, str],
    worker: bool = False,
    port: int | None = None,
    stdout: int = subprocess.DEVNULL,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`gateway serve` on `port` (a free loopback port unless given: a test that must name
    the URL in the server's settings picks one first), ready when this yields; with the
    writer of ingest jobs beside it when `worker` (a second process that loads the model)."""
    port = port or free_port()
    process = subprocess.Popen(
        [gateway_command(), "serve", "--host", "127.0.0.1", "--port", str(port)]
        + ([] if worker else ["--no-worker"]),
        env=env,
        stdout=stdout,  # uvicorn's access log (PIPE: a test reads it; keep it short)
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(process, f"{base}/readyz")
        yield base, process
    finally:
        process.terminate()
        process.wait(timeout=30)
        for stream in (process.stdout, process.stderr):
            if stream:
                stream.close()


def run_gateway(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [gateway_command(), *args], env=env, capture_output=True, text=True, timeout=300
    )
