"""The observability path with real parts: a `gateway serve` process exports its traces over
OTLP to a Rotel collector process and is scraped by a Prometheus process that evaluates the
shipped alert rules; every query of the shipped Grafana dashboard runs against that
Prometheus; `promtool` checks and unit-tests the rules.

Rotel is the dev extra's `rotel` (an OpenTelemetry collector; no otelcol build installs
here) and Prometheus is Debian's `prometheus` package; each test skips, naming what to
install, only where its program is missing.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.bench.server import free_port
from tests.helpers.callers import ALICE
from tests.helpers.identity import AUDIENCE, ISSUER, TokenFactory, bearer
from tests.helpers.processes import gateway_env, running_server
from tests.helpers.tracing import exercise, forbidden_texts

pytestmark = pytest.mark.server

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
DASHBOARD = DEPLOY / "grafana" / "gateway-dashboard.json"


def rotel_agent() -> Path:
    spec = importlib.util.find_spec("rotel")
    if spec is None or spec.origin is None:
        pytest.skip("the Rotel collector is not installed (pip install rotel: the dev extra)")
    return Path(spec.origin).parent / "rotel-agent"


def program(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (Debian: apt-get install prometheus)")
    return found


@pytest.fixture(scope="module")
def collector(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A Rotel process on loopback that prints every span it receives to its output."""
    agent = rotel_agent()
    directory = tmp_path_factory.mktemp("rotel")
    output = directory / "spans.txt"
    http_port = free_port()
    command = [
        str(agent), "start",
        "--otlp-http-endpoint", f"127.0.0.1:{http_port}",
        "--otlp-grpc-endpoint", f"127.0.0.1:{free_port()}",
        "--exporter", "blackhole",
        "--debug-log", "traces", "--debug-log-verbosity", "detailed",
        "--pid-file", str(directory / "rotel.pid"), "--log-file", str(directory / "rotel.log"),
    ]  # fmt: skip
    with output.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while "Starting Rotel" not in output.read_text(errors="replace"):
            assert process.poll() is None, output.read_text(errors="replace")
            assert time.monotonic() < deadline, "Rotel did not start"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{http_port}", output
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def server(
    collector: tuple[str, Path], data_dir: Path, jwks_file: Path
) -> Iterator[tuple[str, Path]]:
    endpoint, spans = collector
    env = gateway_env(
        GATEWAY_DATA_DIR=str(data_dir),
        GATEWAY_OIDC_ISSUER=ISSUER,
        GATEWAY_OIDC_AUDIENCE=AUDIENCE,
        GATEWAY_JWKS_URI=jwks_file.as_uri(),
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
        OTEL_BSP_SCHEDULE_DELAY="200",  # batches leave every 0.2 s, not every 5 s
    )
    with running_server(env) as (base, _process):
        yield base, spans


def test_traces_reach_a_real_collector_with_ids_only(
    server: tuple[str, Path], make_token: TokenFactory
) -> None:
    base, spans = server
    with httpx.Client(base_url=base, timeout=60) as client:
        answers, trace_ids = exercise(client, make_token)  # type: ignore[arg-type]
    deadline = time.monotonic() + 20
    while not all(t in (printed := spans.read_text(errors="replace")) for t in trace_ids):
        assert time.monotonic() < deadline, "not every trace reached the collector"
        time.sleep(0.2)
    assert "service.name: Str(rag-gateway)" in printed
    names = {line.split(":", 1)[1].strip() for line in printed.splitlines() if "Name  " in line}
    assert {"search", "answer", "bm25", "dense", "fuse", "document", "chunk"} <= names
    assert "refund-policy@2:0" in printed  # IDs go out
    for text in forbidden_texts(answers):  # content never does
        assert text not in printed, f"exported content: {text[:40]!r}"


@pytest.fixture(scope="module")
def prometheus(server: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Prometheus scraping the server every second and evaluating the shipped rules."""
    binary = program("prometheus")
    directory = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {
                "job_name": "gateway",
                "static_configs": [{"targets": [server[0].removeprefix("http://")]}],
            }
        ],
    }
    (directory / "prometheus.yaml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (directory / "log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={directory / 'prometheus.yaml'}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        with httpx.Client(timeout=1) as client:  # one CA bundle load, not one per poll
            while True:
                assert process.poll() is None, (directory / "log").read_text()[-2000:]
                try:
                    if client.get(f"{base}/-/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "Prometheus did not start"
                time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=10)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", (promql, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def eventually(prometheus: str, promql: str, seconds: float = 30) -> list[dict[str, Any]]:
    """The query's result once it has one (scrapes come every second)."""
    deadline = time.monotonic() + seconds
    while not (result := query(prometheus, promql)):
        assert time.monotonic() < deadline, f"no data for {promql}"
        time.sleep(0.5)
    return result


def test_prometheus_scrapes_the_series_the_dashboard_and_alerts_use(
    server: tuple[str, Path], prometheus: str, make_token: TokenFactory
) -> None:
    base, _spans = server
    alice = bearer(make_token(**ALICE))
    with httpx.Client(base_url=base, timeout=60) as client:
        for _ in range(5):
            assert client.post("/search", json={"query": "refunds"}, headers=alice).is_success
        assert client.post("/search", json={"query": "refunds"}).status_code == 401
    searched = 'sum(gateway_requests_total{job="gateway", route="/search", status="200"})'
    deadline = time.monotonic() + 30
    while not (found := query(prometheus, searched)) or float(found[0]["value"][1]) < 5:
        assert time.monotonic() < deadline, "the searches were not scraped"
        time.sleep(0.5)
    assert float(eventually(prometheus, 'up{job="gateway"}')[0]["value"][1]) == 1

    # Every panel's query is valid PromQL over series the gateway exports; the core ones
    # have data once a few requests have been scraped twice.
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 15
    for expr in exprs:
        query(prometheus, expr)
    for title in (
        "Requests per second by route",
        "p95 by route (time to first byte)",
        "Availability (non-5xx share, 5m)",
        "Ingest backlog (jobs)",
        "Index generation served, by process",
        "Audit lag p95 (request to committed record)",
    ):
        panel = next(p for p in board["panels"] if p["title"] == title)
        eventually(prometheus, panel["targets"][0]["expr"])

    # The shipped rules load and evaluate cleanly against the live series; none fires.
    deadline = time.monotonic() + 30
    while True:
        groups = httpx.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        if rules and all(r.get("health") == "ok" for r in rules):
            break
        assert time.monotonic() < deadline, [(r["name"], r.get("lastError")) for r in rules]
        time.sleep(0.5)
    assert len(rules) == len(yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"])
    assert query(prometheus, 'ALERTS{alertstate="firing"}') == []


def test_alert_rules_pass_promtool_check_and_their_unit_tests() -> None:
    promtool = program("promtool")
    checked = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [promtool, "test", "rules", "alerts.test.yaml"],
        cwd=ALERTS.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
