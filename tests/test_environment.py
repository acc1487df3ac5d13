"""Tests see the settings they make: not the GATEWAY_* or OTEL_* variables of the shell."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def test_settings_are_the_defaults() -> None:
    settings = Settings()
    assert settings.data_dir == Path("data") and settings.otel_service_name == "rag-gateway"


@pytest.mark.server  # a pytest process of its own, started from a shell's environment
def test_the_shells_settings_do_not_reach_the_tests() -> None:
    shell = {**os.environ, "GATEWAY_DATA_DIR": "/somewhere/else", "OTEL_SERVICE_NAME": "mine"}
    inner = f"{Path(__file__).name}::test_settings_are_the_defaults"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/{inner}"],
        cwd=ROOT,
        env=shell,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:]
