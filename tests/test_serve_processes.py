"""`gateway serve --processes 2` as real processes on loopback: every request may land on
either process, and nothing a client sees may depend on which did. Each test holds a
connection to each process (found from /proc: which child owns the accepted socket), so
what one process did is asked of the other."""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.api.headers import POLICY_HEADER
from gateway.api.processes import ABANDONED_AFTER_S, sweep_abandoned
from gateway.bench.server import free_port, gateway_command, gateway_ready
from tests.helpers.identity import TokenFactory
from tests.helpers.policies import write_policy
from tests.helpers.processes import allowed_cpus, children, running_server, served_env, until

pytestmark = [pytest.mark.server, pytest.mark.model]

RATIONED = {"rate_per_s": 0.001, "burst": 5}  # five requests a subject, then one in 1,000 s
OUTCOMES = ("loaded", "unchanged", "refused")
STARTUP_FAILURE = 3  # uvicorn's status for a server that could not start
_callers = itertools.count()


class Connection:
    """One keep-alive HTTP connection, and the process that accepted it."""

    def __init__(self, base: str, server: int) -> None:
        host, port = base.removeprefix("http://").split(":")
        self.port = int(port)
        self._http = http.client.HTTPConnection(host, self.port, timeout=60)
        self.request("GET", "/healthz")  # accepted by now
        self.owner = _owner(server, self.port, self._http.sock.getsockname()[1])
        self._http.auto_open = 0  # never silently again, maybe to the other process

    def request(
        self, method: str, path: str, token: str | None = None, body: object = None
    ) -> tuple[int, dict[str, str], bytes]:
        headers = {"content-type": "application/json"}
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        data = None if body is None else json.dumps(body)
        self._http.request(method, path, body=data, headers=headers)
        response = self._http.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()

    def search(self, token: str) -> tuple[int, dict[str, str]]:
        status, headers, _ = self.request("POST", "/search", token, {"query": "refund"})
        return status, headers

    def policy_version(self, make_token: TokenFactory) -> str:
        """The version a search is served under, asked by a caller of its own (the policy
        limits each to five requests)."""
        status, headers = self.search(make_token(sub=f"caller-{next(_callers)}"))
        assert status == 200
        return headers[POLICY_HEADER.lower()]

    def metric(self, line_start: str) -> float:
        _, _, body = self.request("GET", "/metrics")
        values = [
            float(line.rsplit(" ", 1)[1])
            for line in body.decode().splitlines()
            if line.startswith(line_start)
        ]
        return sum(values)

    def close(self) -> None:
        self._http.close()


def _owner(server: int, server_port: int, client_port: int) -> int:
    """The child of `server` holding the accepted end of the connection from `client_port`."""
    inodes = {
        fields[9]
        for fields in (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
        if int(fields[1].split(":")[1], 16) == server_port
        and int(fields[2].split(":")[1], 16) == client_port
    }
    for pid in serving(server):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd).removeprefix("socket:[").removesuffix("]") in inodes:
                    return pid
            except OSError:
                continue
    raise AssertionError(f"no process of {server} holds the connection from {client_port}")


def serving(server: int) -> set[int]:
    """The processes that serve requests: uvicorn's spawned children."""
    return {pid for pid in children(server) if b"spawn_main" in _cmdline(pid)}


def writers(server: int) -> set[int]:
    return {pid for pid in children(server) if b"worker" in _cmdline(pid)}


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_policy(tmp_path_factory.mktemp("group-policy"), limits={"per_subject": RATIONED})


@pytest.fixture(scope="module")
def group(
    data_dir: Path, jwks_file: Path, policy_dir: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    env = served_env(
        data_dir,
        jwks_file,
        GATEWAY_POLICY_DIR=str(policy_dir),
        GATEWAY_POLICY_WATCH_INTERVAL_S="0",  # only SIGHUP or the admin route reload here
        GATEWAY_SERVE_PROCESSES="2",
    )
    with running_server(env, worker=True) as started:
        until(lambda: len(serving(started[1].pid)) == 2)
        yield started


@pytest.fixture
def pair(group: tuple[str, subprocess.Popen[bytes]]) -> Iterator[tuple[Connection, Connection]]:
    """A connection to each of the two processes (new connections until both are held)."""
    base, server = group
    held: dict[int, Connection] = {}
    spare = []
    for _ in range(200):
        connection = Connection(base, server.pid)
        if connection.owner in held:
            spare.append(connection)
        else:
            held[connection.owner] = connection
        if len(held) == 2:
            break
    for connection in spare:
        connection.close()
    assert len(held) == 2, "200 connections all landed on one process"
    first, second = held.values()
    yield first, second
    first.close()
    second.close()


def set_bm25_budget(policy: Path, ms: int) -> None:
    """A change to the policy that changes its version and nothing a test here sees."""
    policy.write_text(re.sub(r"bm25_ms: \d+", f"bm25_ms: {ms}", policy.read_text()))


@contextlib.contextmanager
def refused_policy(policy: Path) -> Iterator[None]:
    """The policy file one no process can load, inside; as it was, afterwards."""
    good = policy.read_text()
    policy.write_text("budgets: [not, a, mapping]\n")
    try:
        yield
    finally:
        policy.write_text(good)


def asked_anew(base: str, server: int, make_token: TokenFactory) -> str:
    """The policy version a search on a new connection is served under."""
    connection = Connection(base, server)
    try:
        return connection.policy_version(make_token)
    finally:
        connection.close()


def admin(make_token: TokenFactory, name: str) -> str:
    return make_token(sub=name, groups=["ops", "staff"])


def test_both_processes_answer_and_either_counts_every_request(
    pair: tuple[Connection, Connection], make_token: TokenFactory
) -> None:
    first, second = pair
    searched = 'gateway_requests_total{route="/search",status="200"}'
    before = first.metric(searched)
    for connection in (first, second, first, second):
        connection.policy_version(make_token)
    # A request is counted once its response is out: the client may ask before that.
    until(lambda: first.metric(searched) == second.metric(searched) == before + 4, 5)


def test_the_processes_of_a_group_pin_no_thread_by_default(
    pair: tuple[Connection, Connection], make_token: TokenFactory
) -> None:
    """`GATEWAY_LANE_CPUS=auto`, the default, splits a process serving alone on two CPUs;
    a group's processes share them: split, each would put its dense lane on the same CPUs."""
    for connection in pair:
        connection.policy_version(make_token)  # a search answered: the lanes have run
        tasks = list(Path(f"/proc/{connection.owner}/task").iterdir())
        assert len(tasks) > 3 * 4 + 4  # the lanes' workers are among them
        everywhere = frozenset(os.sched_getaffinity(connection.owner))
        assert {allowed_cpus(task / "status") for task in tasks} == {everywhere}


def test_a_rate_limit_holds_across_processes(
    pair: tuple[Connection, Connection], make_token: TokenFactory
) -> None:
    """Five a subject: three taken on one process and two on the other exhaust them for
    both (buckets of each process's own would let each take five). Asked on a route
    without a body: a POST refused before its body is read closes the connection."""
    first, second = pair
    token = make_token(sub="rationed")
    for connection in (first, first, first, second, second):
        assert connection.request("GET", "/v1/models", token)[0] == 200
    for connection in (first, second):
        status, headers, _ = connection.request("GET", "/v1/models", token)
        assert status == 429
        assert int(headers["retry-after"]) > 0
    refused = first.metric("gateway_rate_limited_total")
    assert refused == second.metric("gateway_rate_limited_total") >= 2


def test_sighup_reloads_the_policy_in_every_process_without_restarting_them(
    group: tuple[str, subprocess.Popen[bytes]],
    pair: tuple[Connection, Connection],
    policy_dir: Path,
    make_token: TokenFactory,
) -> None:
    _, server = group
    first, second = pair
    processes = serving(server.pid)
    before = first.policy_version(make_token)
    loaded = 'gateway_policy_reloads_total{outcome="loaded"}'
    loads = first.metric(loaded)
    policy = policy_dir / "policy.yaml"
    set_bm25_budget(policy, 320)
    server.send_signal(signal.SIGHUP)
    for connection in (first, second):
        until(lambda c=connection: c.policy_version(make_token) != before, 20)
    assert serving(server.pid) == processes  # reloaded in place, not restarted
    # Either process tells of both reloads (its own, and its sibling's last snapshot).
    for connection in (first, second):
        until(lambda c=connection: c.metric(loaded) == loads + 2, 10)

    # A policy refused on SIGHUP leaves every process serving the one it had.
    served = first.policy_version(make_token)
    refused = 'gateway_policy_reloads_total{outcome="refused"}'
    refusals = first.metric(refused)
    with refused_policy(policy):
        server.send_signal(signal.SIGHUP)
        for connection in (first, second):
            until(lambda c=connection: c.metric(refused) == refusals + 2, 10)
            assert connection.policy_version(make_token) == served
        assert serving(server.pid) == processes


def test_an_admin_reload_on_one_process_reaches_the_other(
    pair: tuple[Connection, Connection], policy_dir: Path, make_token: TokenFactory
) -> None:
    first, second = pair
    before = second.policy_version(make_token)
    counts = {o: first.metric(f'gateway_policy_reloads_total{{outcome="{o}"}}') for o in OUTCOMES}
    policy = policy_dir / "policy.yaml"
    set_bm25_budget(policy, 280)
    status, _, body = first.request("POST", "/admin/policy/reload", admin(make_token, "op-1"))
    assert status == 200, body
    reloaded = json.loads(body)["version"]
    assert reloaded != before
    until(lambda: second.policy_version(make_token) == reloaded, 20)
    # Each process reloaded once: the one asked is not asked again by the parent, so both
    # tell the same of their last reload.
    for n, connection in enumerate((first, second)):
        _, _, said = connection.request("GET", "/admin/policy", admin(make_token, f"op-{n + 2}"))
        assert json.loads(said)["last_reload"]["outcome"] == "loaded"
    time.sleep(1.5)  # the snapshots each process writes every second
    for connection in (first, second):
        assert {
            o: connection.metric(f'gateway_policy_reloads_total{{outcome="{o}"}}') for o in OUTCOMES
        } == {**counts, "loaded": counts["loaded"] + 2}


def test_every_process_tells_of_the_writer_the_parent_runs(
    group: tuple[str, subprocess.Popen[bytes]], pair: tuple[Connection, Connection]
) -> None:
    _, server = group
    first, second = pair
    assert first.metric("gateway_writer_up ") == second.metric("gateway_writer_up ") == 1
    restarts = first.metric("gateway_writer_restarts_total")
    (writer,) = writers(server.pid)
    os.kill(writer, signal.SIGKILL)
    until(lambda: second.metric("gateway_writer_restarts_total") == restarts + 1, 30)
    until(lambda: first.metric("gateway_writer_up ") == 1, 30)
    for connection in (first, second):
        status, _, body = connection.request("GET", "/readyz")
        assert status == 200 and json.loads(body)["processes"] == {"ready": 2, "of": 2}


def test_sigttou_and_sigttin_take_a_process_away_and_add_one_counted_anew(
    group: tuple[str, subprocess.Popen[bytes]],
) -> None:
    """uvicorn's signals for one process fewer or more: `/readyz` counts what runs."""
    base, server = group

    def counted() -> object:
        response = httpx.get(f"{base}/readyz", timeout=10)
        return response.json().get("processes") if response.status_code == 200 else None

    os.kill(server.pid, signal.SIGTTOU)
    until(lambda: len(serving(server.pid)) == 1 and counted() == {"ready": 1, "of": 1}, 30)
    os.kill(server.pid, signal.SIGTTIN)
    until(lambda: counted() == {"ready": 2, "of": 2}, 90)
    assert len(serving(server.pid)) == 2


def test_a_process_that_cannot_restart_is_retried_while_the_other_serves(
    group: tuple[str, subprocess.Popen[bytes]], policy_dir: Path, make_token: TokenFactory
) -> None:
    """A policy refused on disk, then a process dies: its replacement cannot start. The
    other serves on, the parent stays, and once the policy is mended the process returns."""
    base, server = group
    with refused_policy(policy_dir / "policy.yaml"):
        doomed = min(serving(server.pid))
        os.kill(doomed, signal.SIGKILL)
        until(lambda: doomed not in serving(server.pid), 10)
        time.sleep(8)  # the replacement fails its start, and is tried again
        assert server.poll() is None
        for _ in range(4):
            assert asked_anew(base, server.pid, make_token)
        # The parent counts one started (/readyz would say so, but the writer, refused
        # the policy too, makes it 503 meanwhile).
        assert counted_by_parent(server.pid) == {"ready": 1, "of": 2}
    until(lambda: len(serving(server.pid)) == 2 and doomed not in serving(server.pid), 90)
    assert all(asked_anew(base, server.pid, make_token) for _ in range(4))
    until(lambda: counted_by_parent(server.pid) == {"ready": 2, "of": 2}, 90)


def test_a_process_taken_away_while_waiting_to_restart_leaves_nothing_behind(
    group: tuple[str, subprocess.Popen[bytes]], policy_dir: Path, make_token: TokenFactory
) -> None:
    """SIGTTOU while the last process waits out its retry delay (its start failed): it
    goes with its delay, and a process SIGTTIN adds later at its place starts at once and
    is the only one there: no replacement of the one taken away starts beside it."""
    base, server = group
    os.kill(server.pid, signal.SIGTTOU)  # one process, then a new one: the newest is last
    until(lambda: len(serving(server.pid)) == 1 and counted_by_parent(server.pid)["of"] == 1, 30)
    os.kill(server.pid, signal.SIGTTIN)
    until(lambda: counted_by_parent(server.pid) == {"ready": 2, "of": 2}, 90)
    last = max(serving(server.pid))
    with refused_policy(policy_dir / "policy.yaml"):
        os.kill(last, signal.SIGKILL)
        time.sleep(8)  # its replacement fails its start; the next try waits
        until(lambda: len(serving(server.pid)) == 1, 30)
        os.kill(server.pid, signal.SIGTTOU)
        until(lambda: counted_by_parent(server.pid) == {"ready": 1, "of": 1}, 30)
    os.kill(server.pid, signal.SIGTTIN)
    until(lambda: counted_by_parent(server.pid) == {"ready": 2, "of": 2}, 90)
    for _ in range(10):  # longer than the retry delay the one taken away had
        assert len(serving(server.pid)) == 2
        time.sleep(1)
    assert all(asked_anew(base, server.pid, make_token) for _ in range(4))


def counted_by_parent(server: int) -> dict[str, int]:
    """The parent's count of started processes, read where it writes it."""
    (shared,) = group_dirs(serving(server))
    counted: dict[str, int] = json.loads((shared / "processes.json").read_text())
    return counted


def test_stopping_the_parent_stops_every_process_and_removes_the_shared_state(
    group: tuple[str, subprocess.Popen[bytes]],
) -> None:
    _, server = group
    processes = serving(server.pid) | writers(server.pid)
    roots = group_dirs(serving(server.pid))
    assert len(roots) == 1 and all(root.is_dir() for root in roots)
    server.terminate()
    server.wait(timeout=60)
    until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in processes), 30)
    assert not any(root.exists() for root in roots)


def start_group(env: dict[str, str]) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    process = subprocess.Popen(
        [gateway_command(), "serve", "--no-worker", "--port", str(port), "--processes", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return f"http://127.0.0.1:{port}", process


def test_a_group_that_cannot_start_exits_as_one_process_does(
    tmp_path: Path, data_dir: Path, jwks_file: Path
) -> None:
    broken = tmp_path / "policy"
    broken.mkdir()
    (broken / "policy.yaml").write_text("budgets: [not, a, mapping]\n")
    _, process = start_group(served_env(data_dir, jwks_file, GATEWAY_POLICY_DIR=str(broken)))
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == STARTUP_FAILURE, stderr.decode()[-2000:]


def test_sighup_while_starting_kills_nothing_and_a_parent_killed_takes_its_processes(
    tmp_path: Path, data_dir: Path, jwks_file: Path, policy_dir: Path
) -> None:
    base, process = start_group(served_env(data_dir, jwks_file, GATEWAY_POLICY_DIR=str(policy_dir)))
    try:
        until(lambda: len(serving(process.pid)) == 2, 60)
        first = serving(process.pid)
        deadline = time.monotonic() + 120
        ready = False
        with httpx.Client(timeout=2) as client:
            while not ready:  # a SIGHUP every 0.1 s from the spawn to ready, and a bit after
                assert time.monotonic() < deadline and process.poll() is None
                process.send_signal(signal.SIGHUP)
                time.sleep(0.1)
                with contextlib.suppress(httpx.TransportError):
                    ready = gateway_ready(client.get(f"{base}/readyz"))
        until(lambda: len(serving(process.pid)) == 2, 60)
        assert serving(process.pid) == first  # none died and was replaced
        roots = group_dirs(first)
        for root in roots:  # a live group keeps its directory touched
            os.utime(root, (0, 0))
            until(lambda root=root: root.stat().st_mtime > time.time() - 60, 10)
        process.kill()  # SIGKILL: the parent cannot stop them itself
        process.wait(timeout=30)
        until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in first), 30)
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)
    # What a killed parent leaves behind, named by it, goes at the next group's start once
    # nothing has written into it for a while.
    assert roots and all(r.name.startswith(f"gateway-serve-{process.pid}-") for r in roots)
    assert all(r.exists() for r in roots)
    for root in roots:
        past = time.time() - ABANDONED_AFTER_S - 5
        os.utime(root, (past, past))
    assert roots <= set(sweep_abandoned(next(iter(roots)).parent))
    assert not any(r.exists() for r in roots)


def group_dirs(pids: set[int]) -> set[Path]:
    """The shared directory named in the environment of these processes."""
    return {
        Path(var.split(b"=", 1)[1].decode())
        for pid in pids
        for var in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if var.startswith(b"GATEWAY_PROCESS_GROUP_DIR=")
    }
