"""The scale-out deployment files (compose with replicas, a writer, PostgreSQL, SeaweedFS and
a load balancer; Kubernetes manifests) agree with the code, checked statically: no container
engine or cluster runs where these tests do."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gateway.api.limits import ROUTE_LIMITS
from gateway.api.routes import PUBLIC_PATHS
from gateway.cli import app
from tests.helpers.deploy import service_env, settings_env_names

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
OTEL = {"OTEL_SERVICE_NAME", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT"}
ROLES = {"migrate": ["db", "upgrade"], "writer": ["worker"], "replica": ["serve", "--no-worker"]}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "docker-compose.scale.yaml").read_text())
    return loaded


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    return [
        d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "gateway.yaml").read_text()) if d
    ]


def runs(command: list[str]) -> None:
    """The gateway accepts the command line (asked for its help, so nothing starts)."""
    assert command[0] == "gateway"
    result = CliRunner().invoke(app, [*command[1:], "--help"])
    assert result.exit_code == 0, (command, result.output)


def test_compose_has_the_topology(compose: dict[str, Any]) -> None:
    services = set(compose["services"])
    assert {"postgres", "seaweedfs", "migrate", "writer", "replica", "loadbalancer"} <= services
    assert "otel-collector" in services
    for role, words in ROLES.items():
        command = compose["services"][role]["command"]
        assert command[1 : 1 + len(words)] == words, role
        runs(command)


def test_compose_settings_are_read_by_the_gateway(compose: dict[str, Any]) -> None:
    for role in ROLES:
        env = service_env(compose["services"][role])
        assert set(env) <= settings_env_names() | OTEL, role
        assert env["GATEWAY_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert env["GATEWAY_INDEX_URI"].startswith("s3://")
        assert env["AWS_ENDPOINT_URL"].startswith("http://seaweedfs:")


def test_the_others_wait_for_the_schema_upgrade(compose: dict[str, Any]) -> None:
    for role in ("writer", "replica"):
        condition = compose["services"][role]["depends_on"]["migrate"]["condition"]
        assert condition == "service_completed_successfully"


def test_the_load_balancer_passes_the_largest_body_and_streams() -> None:
    conf = (DEPLOY / "nginx.conf").read_text()
    size = re.search(r"client_max_body_size (\d+)m;", conf)
    assert size and int(size.group(1)) * 1024 * 1024 >= max(ROUTE_LIMITS.values())
    assert "proxy_buffering off;" in conf  # server-sent events
    assert "server replica:8080" in conf


def test_kubernetes_roles_run_the_right_commands(manifests: list[dict[str, Any]]) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in manifests}
    assert ("Job", "gateway-db-upgrade") in kinds and ("Service", "gateway") in kinds
    containers = {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]
        for d in manifests
        if d["kind"] in ("Deployment", "Job") and d["metadata"]["name"].startswith("gateway")
    }
    expected = {
        "gateway-db-upgrade": "migrate",
        "gateway-writer": "writer",
        "gateway-replica": "replica",
    }
    for name, role in expected.items():
        command = containers[name]["command"]
        assert command[1 : 1 + len(ROLES[role])] == ROLES[role], name
        runs(command)
        assert containers[name]["envFrom"] == [
            {"configMapRef": {"name": "gateway-config"}},
            {"secretRef": {"name": "gateway-secrets"}},
        ]
    probes = containers["gateway-replica"]
    assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert probes["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"/readyz", "/healthz"} <= set(PUBLIC_PATHS)


def test_kubernetes_settings_are_read_by_the_gateway(manifests: list[dict[str, Any]]) -> None:
    config = next(d for d in manifests if d["kind"] == "ConfigMap")["data"]
    secret = next(d for d in manifests if d["kind"] == "Secret")["stringData"]
    assert set(config) | set(secret) <= settings_env_names() | OTEL
    assert "GATEWAY_DATABASE_URL" in secret and "AWS_SECRET_ACCESS_KEY" in secret
