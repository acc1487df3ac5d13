"""Real `gateway` processes for tests: a server on loopback, and commands run to completion."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from gateway.bench.server import await_ready, free_port, gateway_command, gateway_ready
from tests.helpers.identity import AUDIENCE, ISSUER

# The `reap` fixture (tests/conftest.py): registers a process to kill at teardown.
Reap = Callable[[subprocess.Popen[bytes]], subprocess.Popen[bytes]]


def gateway_env(**settings: str) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", **settings}


def served_env(data_dir: Path, jwks_file: Path, **settings: str) -> dict[str, str]:
    """`gateway_env` for a server of `data_dir` that trusts the tests' issuer (its keys in
    `jwks_file`)."""
    return gateway_env(
        GATEWAY_DATA_DIR=str(data_dir),
        GATEWAY_OIDC_ISSUER=ISSUER,
        GATEWAY_OIDC_AUDIENCE=AUDIENCE,
        GATEWAY_JWKS_URI=jwks_file.as_uri(),
        **settings,
    )


def children(pid: int) -> set[int]:
    """The processes `pid` started that are still running (from any of its threads)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(c) for c in (task / "children").read_text().split()}
    return found


def allowed_cpus(status: Path) -> frozenset[int]:
    """A task's CPUs, as /proc/<pid>/task/<tid>/status lists them (`0-1`, `0,2-3`)."""
    (line,) = [x for x in status.read_text().splitlines() if x.startswith("Cpus_allowed_list")]
    cpus: set[int] = set()
    for part in line.split(":", 1)[1].strip().split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return frozenset(cpus)


def until(condition: Callable[[], bool], seconds: float = 120) -> None:
    """Until `condition` holds; fails the test when `seconds` pass first."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.05)


def wait_until_ready(process: subprocess.Popen[bytes], url: str, seconds: float = 120) -> None:
    """Until `url` answers 200; fails the test if the process exits or time runs out."""
    said = _await(process, url, seconds, lambda response: response.status_code == 200)
    if said is not None:
        pytest.fail(f"{process.args!r} exited: {said}")


def _await(
    process: subprocess.Popen[bytes],
    url: str,
    seconds: float,
    ready: Callable[[httpx.Response], bool],
) -> str | None:
    """None once `url` answers as `ready` says; the end of the process's stderr if it exits
    first; fails the test when time runs out."""
    try:
        return await_ready(process, url, ready, seconds, 0.3)
    except TimeoutError as exc:
        pytest.fail(str(exc))


# A port picked free can be bound by another process (an S3 store's, a client's) before the
# server binds it: the server then exits, and starts again on another port.
STARTS = 3


@contextmanager
def running_server(
    env: dict[str, str],
    worker: bool = False,
    port: int | None = None,
    stdout: int = subprocess.DEVNULL,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`gateway serve` on `port` (a free loopback port unless given: a test that must name
    the URL in the server's settings picks one first), ready when this yields; with the
    writer of ingest jobs beside it when `worker` (a second process that loads the model).
    Ready means the gateway's own /readyz says so, not whatever else answers on the port."""
    for attempt in range(1, STARTS + 1):
        chosen = port or free_port()
        process = subprocess.Popen(
            [gateway_command(), "serve", "--host", "127.0.0.1", "--port", str(chosen)]
            + ([] if worker else ["--no-worker"]),
            env=env,
            stdout=stdout,  # uvicorn's access log (PIPE: a test reads it; keep it short)
            stderr=subprocess.PIPE,
        )
        base = f"http://127.0.0.1:{chosen}"
        try:
            said = _await(process, f"{base}/readyz", 120, gateway_ready)
        except BaseException:
            _stop(process)
            raise
        if said is None:
            break
        _stop(process)
        taken = "address already in use" in said
        if not taken or port is not None or attempt == STARTS:
            pytest.fail(f"{process.args!r} exited: {said}")
    try:
        yield base, process
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    process.wait(timeout=30)
    for stream in (process.stdout, process.stderr):
        if stream:
            stream.close()


def run_gateway(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [gateway_command(), *args], env=env, capture_output=True, text=True, timeout=300
    )


@contextmanager
def logged_command(
    args: list[str], env: dict[str, str], log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """`gateway <args>` running with its output in `log`; on leaving, stopped as an
    operator stops it (SIGTERM), which must end it cleanly (exit 0)."""
    with log.open("wb") as out:
        process = subprocess.Popen([gateway_command(), *args], env=env, stdout=out, stderr=out)
        try:
            yield process
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == 0, log.read_text()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def wait_for_line(log: Path, process: subprocess.Popen[bytes], line: str) -> None:
    """Until `line` is in the process's `log`; fails if the process ends first."""
    deadline = time.monotonic() + 120
    while line not in log.read_text():
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
