"""The measurement helpers' own rules (gateway/bench/server.py), without a server."""

from __future__ import annotations

import argparse

import httpx
import pytest

from gateway.bench.server import add_also_env, also_env_settings, gateway_ready


def readyz(status: int, body: object) -> httpx.Response:
    return httpx.Response(status, json=body)


def test_a_group_counts_as_ready_once_every_process_has_started() -> None:
    """A measurement waits for all of `--processes N`: ready from the first process
    would load that one alone."""
    ready = {"status": "ready", "index_generation": 1}
    assert gateway_ready(readyz(200, ready))  # one process: no count
    assert not gateway_ready(readyz(200, {**ready, "processes": {"ready": 1, "of": 2}}))
    assert gateway_ready(readyz(200, {**ready, "processes": {"ready": 2, "of": 2}}))
    assert not gateway_ready(readyz(503, {"code": "not_ready"}))
    assert not gateway_ready(httpx.Response(200, text=""))  # another server on the port


def test_the_scripts_also_env_takes_settings_and_refuses_a_pair_without_a_value(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser(prog="measure")
    add_also_env(parser, "settings")
    args = parser.parse_args(["--also-env", "A=1", "--also-env", "B=x=y"])
    assert also_env_settings(args.also_env) == {"A": "1", "B": "x=y"}
    with pytest.raises(SystemExit):
        parser.parse_args(["--also-env", "GATEWAY_LANE_CPUS"])
    assert "'GATEWAY_LANE_CPUS' is not NAME=VALUE" in capsys.readouterr().err
