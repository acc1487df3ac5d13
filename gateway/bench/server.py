"""The installed `gateway` command run as a real server, for `gateway bench` and the
measurement scripts: a throwaway issuer it trusts, startup timed, the process's memory read."""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from gateway.authn.devkeys import SigningKey, generate_signing_key, write_jwks

# How long a measured server may take to say ready. At its first start on a large data dir
# it builds its vector copy (a minute or more at 1M chunks); past this something is wrong,
# and the measurement says so instead of waiting for ever.
STARTUP_S = 600.0


def gateway_command() -> str:
    """The `gateway` of this interpreter's environment, not whichever is first on PATH."""
    return shutil.which("gateway", path=str(Path(sys.executable).parent)) or "gateway"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class RunningGateway:
    base: str  # http://127.0.0.1:<port>
    pid: int
    startup_s: float  # from starting the process to /readyz answering 200

    def memory_mb(self) -> dict[str, float]:
        return memory_mb(self.pid)

    def cpu_s(self) -> float | None:
        """Its CPU seconds so far; None where /proc is not available."""
        try:
            return cpu_s(self.pid)
        except OSError:
            return None


def cpu_s(pid: int) -> float:
    """CPU seconds a process and its live descendants (a `serve --processes N`'s
    processes, its writer) have used so far, all their threads, from /proc (Linux)."""
    ticks = 0
    for stat in _tree_files(pid, "stat"):
        fields = stat.rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime + stime
    return ticks / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """The live processes below `pid`, from /proc (Linux; empty where it is absent)."""
    found, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def _tree_files(pid: int, name: str) -> list[str]:
    """/proc/<p>/<name> of `pid` (OSError when it cannot be read) and of each descendant
    still there when read."""
    texts = [Path(f"/proc/{pid}/{name}").read_text()]
    for one in descendants(pid):
        try:
            texts.append(Path(f"/proc/{one}/{name}").read_text())
        except OSError:
            continue  # exited meanwhile
    return texts


def memory_mb(pid: int) -> dict[str, float]:
    """A process's resident memory now (`rss`) and at its peak (`peak`), with its live
    descendants' added, and now their proportional share (`pss`: a page N of them map
    counts 1/N in each, so the sum is what the tree holds), from /proc (Linux); empty
    where /proc is not available."""
    try:
        statuses = _tree_files(pid, "status")
        rollups = _tree_files(pid, "smaps_rollup")
    except OSError:
        return {}
    kib = {"rss": 0.0, "peak": 0.0, "pss": 0.0}
    for status in statuses:
        fields = _fields(status)
        if "VmRSS" not in fields:
            continue  # a zombie, not yet reaped: it holds no memory
        for k, f in (("rss", "VmRSS"), ("peak", "VmHWM")):
            kib[k] += float(fields[f].split()[0])
    for rollup in rollups:
        kib["pss"] += float(_fields(rollup).get("Pss", "0 kB").split()[0])
    return {k: round(v / 1024, 1) for k, v in kib.items()}


def _fields(text: str) -> dict[str, str]:
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def gateway_ready(response: httpx.Response) -> bool:
    """The answer of a gateway's own /readyz, saying ready with every process it serves
    from started: a group is ready from its first, and a measurement begun then would
    load that one alone (the others' starts counted in its CPU). Another server that
    bound the port while the gateway was starting is not taken for it (an S3 store answers
    200 with an empty body there)."""
    if response.status_code != 200 or "json" not in response.headers.get("content-type", ""):
        return False
    try:
        body = response.json()
    except ValueError:  # a body that only claims to be JSON
        return False
    if not isinstance(body, dict) or body.get("status") != "ready":
        return False
    processes = body.get("processes")
    if processes is None:
        return True  # one process
    return isinstance(processes, dict) and processes.get("ready") == processes.get("of")


def await_ready(
    process: subprocess.Popen[bytes],
    url: str,
    ready: Callable[[httpx.Response], bool],
    seconds: float,
    interval: float,
) -> str | None:
    """None once `url` answers as `ready` says; if `process` exits first, the end of its
    stderr ("" when not piped); TimeoutError when `seconds` run out. One client for every
    poll: `httpx.get` makes a new one per call, and each loads the CA bundle (20 ms of CPU,
    taken from the server starting beside it)."""
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=1) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return process.stderr.read().decode()[-2000:] if process.stderr else ""
            try:
                if ready(client.get(url)):
                    return None
            except httpx.TransportError:
                pass
            time.sleep(interval)
    raise TimeoutError(f"{url} not ready in {seconds:.0f} s")


@contextmanager
def running_gateway(
    arguments: list[str], env: Mapping[str, str] | None = None
) -> Iterator[RunningGateway]:
    """`gateway <arguments> --port P` in the background; yields it once its /readyz says
    ready, and stops it on the way out."""
    port = free_port()
    started = time.perf_counter()
    server = subprocess.Popen(
        [gateway_command(), *arguments, "--port", str(port)],
        env=dict(env) if env is not None else None,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        if await_ready(server, f"{base}/readyz", gateway_ready, STARTUP_S, 0.05) is not None:
            raise RuntimeError(f"gateway {arguments[0]} exited with {server.returncode}")
        yield RunningGateway(base, server.pid, time.perf_counter() - started)
    finally:
        server.terminate()
        server.wait()


@dataclass(frozen=True)
class ThrowawayIssuer:
    """A signing key whose JWKS the served gateway trusts, and the settings saying so."""

    key: SigningKey
    env: dict[str, str]

    def token(
        self, tenant: str = "acme", region: str = "EU", groups: tuple[str, ...] = ("staff",)
    ) -> str:
        claims = {"iss": "https://m", "aud": "m", "sub": "u", "tenant": tenant, "region": region}
        return self.key.sign({**claims, "groups": list(groups), "exp": int(time.time()) + 3600})


def throwaway_issuer(work: Path, data: Path) -> ThrowawayIssuer:
    """An issuer for one measurement: its JWKS in `work`, the gateway serving `data`."""
    key = generate_signing_key("ES256", kid="measure")
    write_jwks(work / "jwks.json", key.public_jwks())
    env = {
        **os.environ,
        "GATEWAY_DATA_DIR": str(data),
        "GATEWAY_OIDC_ISSUER": "https://m",
        "GATEWAY_OIDC_AUDIENCE": "m",
        "GATEWAY_JWKS_URI": (work / "jwks.json").as_uri(),
    }
    return ThrowawayIssuer(key, env)


def add_also_env(parser: argparse.ArgumentParser, help_text: str) -> None:
    """The measurement scripts' `--also-env NAME=VALUE` (repeatable): one more server of
    this code with these settings (`also_env_settings`). A pair without `=` is refused by
    argparse, naming it."""
    parser.add_argument(
        "--also-env", action="append", default=[], metavar="NAME=VALUE", type=_setting,
        help=help_text,
    )  # fmt: skip


def also_env_settings(pairs: list[str]) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in pairs)


def _setting(pair: str) -> str:
    name, equals, _ = pair.partition("=")
    if not name or not equals:
        raise argparse.ArgumentTypeError(f"{pair!r} is not NAME=VALUE")
    return pair
