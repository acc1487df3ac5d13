"""For the measurement scripts: the installed `gateway` command, run as a real server."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx


def gateway_command() -> str:
    """The `gateway` of this interpreter's environment, not whichever is first on PATH."""
    return shutil.which("gateway", path=str(Path(sys.executable).parent)) or "gateway"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_gateway(arguments: list[str], env: Mapping[str, str] | None = None) -> Iterator[str]:
    """`gateway <arguments> --port P` in the background; yields its base URL once /readyz
    answers 200, and stops it on the way out."""
    port = free_port()
    server = subprocess.Popen(
        [gateway_command(), *arguments, "--port", str(port)],
        env=dict(env) if env is not None else None,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"gateway {arguments[0]} exited with {server.returncode}")
            try:
                if httpx.get(f"{base}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        yield base
    finally:
        server.terminate()
        server.wait()
