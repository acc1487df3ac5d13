"""The deployment files agree with the code: checked statically, without Docker or network.

No Docker engine is available where these tests run, so the image is never built here; these
tests catch the mistakes that would otherwise only show at the first real build or start.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.settings import Settings
from tests.helpers.deploy import service_env, settings_env_names

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "docker-compose.yaml"
COLLECTOR = DEPLOY / "otel-collector.yaml"
DOCKERIGNORE = ROOT / ".dockerignore"

STANDARD_OTEL_NAMES = frozenset(
    {
        "OTEL_SERVICE_NAME",
        "OTEL_TRACES_EXPORTER",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_RESOURCE_ATTRIBUTES",
    }
)
SERVICES = ("gateway", "otel-collector", "jaeger")


# --- parsing helpers ------------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction; continuations joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # Docker drops comment lines, also inside a continuation
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        keyword, _, args = (buf + line).partition(" ")
        out.append((keyword.upper(), args.strip()))
        buf = ""
    assert not buf, "Dockerfile ends inside a line continuation"
    return out


def stages(instructions: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """Instructions grouped by build stage (each starting with its FROM)."""
    result: list[list[tuple[str, str]]] = []
    for keyword, args in instructions:
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, args))
    return result


def env_of(stage: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in stage:
        if keyword != "ENV":
            continue
        words = shlex.split(args)
        if "=" in words[0]:
            for word in words:
                key, _, value = word.partition("=")
                env[key] = value
        else:  # legacy form: ENV key value
            env[words[0]] = " ".join(words[1:])
    return env


def copy_sources(stage: list[tuple[str, str]]) -> list[str]:
    """Build-context paths a stage COPYs (not those copied from another stage)."""
    sources: list[str] = []
    for keyword, args in stage:
        if keyword not in ("COPY", "ADD"):
            continue
        words = shlex.split(args)
        if any(word.startswith("--from") for word in words):
            continue
        paths = [word for word in words if not word.startswith("--")]
        assert len(paths) >= 2, f"{keyword} {args}: no destination"
        sources += paths[:-1]
    return sources


def ignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """.dockerignore as (negated, regex) in file order; the last match decides."""
    rules: list[tuple[bool, re.Pattern[str]]] = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex += "(?:.*/)?"
                i += 3
            elif pattern.startswith("**", i):
                regex += ".*"
                i += 2
            elif pattern[i] == "*":
                regex += "[^/]*"
                i += 1
            elif pattern[i] == "?":
                regex += "[^/]"
                i += 1
            else:
                regex += re.escape(pattern[i])
                i += 1
        rules.append((negated, re.compile(regex + r"\Z")))
    return rules


def docker_ignored(path: str) -> bool:
    """Whether the build context leaves `path` out (it or one of its parents matches)."""
    parts = PurePosixPath(path.strip("/")).parts
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for negated, regex in ignore_patterns():
        if any(regex.match(candidate) for candidate in candidates):
            ignored = not negated
    return ignored


def port_of(endpoint: str) -> int:
    port = urlsplit(endpoint if "//" in endpoint else f"//{endpoint}").port
    assert port is not None, f"{endpoint}: no port"
    return port


# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def collector() -> dict[str, Any]:
    data = yaml.safe_load(COLLECTOR.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def docker_stages() -> list[list[tuple[str, str]]]:
    result = stages(dockerfile_instructions(DOCKERFILE.read_text()))
    assert result, "Dockerfile has no FROM"
    return result


@pytest.fixture(scope="module")
def final_stage(docker_stages: list[list[tuple[str, str]]]) -> list[tuple[str, str]]:
    return docker_stages[-1]


def last(stage: list[tuple[str, str]], keyword: str) -> str:
    values = [args for kw, args in stage if kw == keyword]
    assert values, f"final stage has no {keyword}"
    return values[-1]


# --- compose --------------------------------------------------------------------------------


def test_compose_defines_the_three_services(compose: dict[str, Any]) -> None:
    assert set(SERVICES) <= set(compose["services"])
    build = compose["services"]["gateway"]["build"]
    assert (COMPOSE.parent / build["context"]).resolve() == ROOT
    assert (ROOT / build["dockerfile"]).resolve() == DOCKERFILE


def test_compose_gateway_names_are_settings_fields(compose: dict[str, Any]) -> None:
    known = settings_env_names()
    assert Settings.model_config.get("env_prefix") == "GATEWAY_"
    for name, service in compose["services"].items():
        for var in service_env(service):
            if var.startswith("GATEWAY_"):
                assert var in known, f"{name}: {var} is not a field of gateway.settings.Settings"
            if var.startswith("OTEL_"):
                assert var in STANDARD_OTEL_NAMES, f"{name}: {var} is not a standard OTEL_ name"


def test_compose_sets_what_serve_requires(compose: dict[str, Any]) -> None:
    env = service_env(compose["services"]["gateway"])
    # `gateway serve` refuses to start without an issuer and an audience.
    assert env.get("GATEWAY_OIDC_ISSUER") and env.get("GATEWAY_OIDC_AUDIENCE")
    assert env["OTEL_TRACES_EXPORTER"] == "otlp"


def test_compose_data_dir_is_a_named_volume(
    compose: dict[str, Any], final_stage: list[tuple[str, str]]
) -> None:
    gateway = compose["services"]["gateway"]
    data_dir = service_env(gateway)["GATEWAY_DATA_DIR"]
    mounts = {}
    for volume in gateway["volumes"]:
        source, target = str(volume).split(":")[:2]
        mounts[target] = source
    assert data_dir in mounts, "the data dir is not mounted"
    assert mounts[data_dir] in (compose.get("volumes") or {}), "data is not a named volume"
    assert env_of(final_stage)["GATEWAY_DATA_DIR"] == data_dir


def test_compose_images_are_pinned(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        if "build" in service:
            continue
        image = service["image"]
        tag = image.rsplit(":", 1)[1] if ":" in image.rsplit("/", 1)[-1] else ""
        assert tag and tag != "latest", f"{name}: image {image} is not pinned"


def test_compose_mounts_the_collector_config(compose: dict[str, Any]) -> None:
    service = compose["services"]["otel-collector"]
    config_args = [arg for arg in service["command"] if arg.startswith("--config=")]
    assert len(config_args) == 1
    config_path = config_args[0].split("=", 1)[1]
    mounts = {str(volume).split(":")[1]: str(volume).split(":")[0] for volume in service["volumes"]}
    assert config_path in mounts
    assert (COMPOSE.parent / mounts[config_path]).resolve() == COLLECTOR


def test_gateway_exports_to_the_collectors_http_receiver(
    compose: dict[str, Any], collector: dict[str, Any]
) -> None:
    env = service_env(compose["services"]["gateway"])
    endpoint = urlsplit(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert endpoint.hostname == "otel-collector"
    assert endpoint.hostname in compose["services"]
    assert env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf") == "http/protobuf"
    http = collector["receivers"]["otlp"]["protocols"]["http"]
    assert endpoint.port == port_of(http["endpoint"])


# --- collector ------------------------------------------------------------------------------


def test_collector_receives_otlp_grpc_and_http(collector: dict[str, Any]) -> None:
    protocols = collector["receivers"]["otlp"]["protocols"]
    assert port_of(protocols["grpc"]["endpoint"]) == 4317
    assert port_of(protocols["http"]["endpoint"]) == 4318


def test_collector_pipelines_use_only_defined_components(collector: dict[str, Any]) -> None:
    pipelines = collector["service"]["pipelines"]
    assert "traces" in pipelines
    for name, pipeline in pipelines.items():
        assert pipeline.get("receivers") and pipeline.get("exporters"), name
        for kind in ("receivers", "processors", "exporters"):
            defined = collector.get(kind) or {}
            for component in pipeline.get(kind) or []:
                assert component in defined, f"pipeline {name}: {kind[:-1]} {component} undefined"


def test_collector_exports_to_jaeger_over_otlp(
    compose: dict[str, Any], collector: dict[str, Any]
) -> None:
    exporter = collector["exporters"]["otlp/jaeger"]
    host, _, port = exporter["endpoint"].rpartition(":")
    assert host in compose["services"] and port == "4317"
    assert exporter["tls"]["insecure"] is True
    assert service_env(compose["services"]["jaeger"])["COLLECTOR_OTLP_ENABLED"] == "true"


# --- Dockerfile -----------------------------------------------------------------------------


def test_dockerfile_base_is_python_311_slim(docker_stages: list[list[tuple[str, str]]]) -> None:
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", DOCKERFILE.read_text(), re.MULTILINE))
    for stage in docker_stages:
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], stage[0][1].split()[0])
        assert image == "python:3.11-slim"


def test_dockerfile_runs_as_non_root(final_stage: list[tuple[str, str]]) -> None:
    user = last(final_stage, "USER").split(":")[0]
    assert user not in ("root", "0", "")


def test_dockerfile_installs_cpu_torch_before_the_project(
    docker_stages: list[list[tuple[str, str]]],
) -> None:
    runs = [args for stage in docker_stages for kw, args in stage if kw == "RUN"]
    torch_at = [i for i, run in enumerate(runs) if "torch==2.13.0" in run]
    project_at = [i for i, run in enumerate(runs) if re.search(r"pip install (\S+ )*\.(\s|$)", run)]
    assert torch_at, "torch==2.13.0 is not installed"
    assert project_at, "the project is not installed with `pip install .`"
    assert max(torch_at) < min(project_at)
    for i in torch_at:
        assert "--index-url https://download.pytorch.org/whl/cpu" in runs[i]


def test_dockerfile_is_offline_at_run_time(final_stage: list[tuple[str, str]]) -> None:
    env = env_of(final_stage)
    assert env.get("HF_HUB_OFFLINE") == "1"
    assert env.get("TRANSFORMERS_OFFLINE") == "1"


def test_dockerfile_serves_what_it_exposes(final_stage: list[tuple[str, str]]) -> None:
    cmd = json.loads(last(final_stage, "CMD"))
    assert cmd[:2] == ["gateway", "serve"]
    options = dict(zip(cmd[2::2], cmd[3::2], strict=True))
    assert options["--host"] == "0.0.0.0"
    assert options["--port"] in last(final_stage, "EXPOSE").split()
    healthcheck = last(final_stage, "HEALTHCHECK")
    assert "urllib" in healthcheck
    assert f"http://127.0.0.1:{options['--port']}/healthz" in healthcheck


def test_dockerfile_policy_dir_is_copied(
    compose: dict[str, Any], final_stage: list[tuple[str, str]]
) -> None:
    policy_dir = env_of(final_stage)["GATEWAY_POLICY_DIR"]
    targets = [shlex.split(args)[-1] for kw, args in final_stage if kw == "COPY"]
    assert policy_dir.rstrip("/") in [target.rstrip("/") for target in targets]
    assert service_env(compose["services"]["gateway"])["GATEWAY_POLICY_DIR"] == policy_dir


def test_dockerfile_copies_existing_unignored_paths(
    docker_stages: list[list[tuple[str, str]]],
) -> None:
    sources = [src for stage in docker_stages for src in copy_sources(stage)]
    assert sources
    for src in sources:
        assert (ROOT / src).exists(), f"COPY {src}: no such path in the repository"
        assert not docker_ignored(src), f"COPY {src}: excluded by .dockerignore"


def test_dockerfile_copies_what_pip_install_needs(
    docker_stages: list[list[tuple[str, str]]],
) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", pyproject["project"]["readme"]}
    needed |= {
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    build = next(stage for stage in docker_stages if any("pip install ." in a for _, a in stage))
    copied = {src.removeprefix("./").rstrip("/") for src in copy_sources(build)}
    assert needed <= copied, f"not copied before `pip install .`: {needed - copied}"


def test_dockerignore_keeps_secrets_and_venv_out() -> None:
    for path in (".git", ".venv", ".env", "data", "gateway/__pycache__/x.pyc"):
        assert docker_ignored(path), path
