"""Policy files: strict parsing, clear problems, a content-hash version, and `policy check`."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.cli import app as cli
from gateway.errors import GatewayError
from gateway.policy.loader import load_policy


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(text)
    return directory


def test_unknown_keys_are_refused_naming_file_and_key(tmp_path: Path) -> None:
    policy = write(tmp_path, "budgets.yaml", "budgets:\n  bm25_ms: 100\n  bypass: true\n")
    with pytest.raises(GatewayError) as error:
        load_policy(policy)
    assert "budgets.yaml" in error.value.detail and "budgets.bypass" in error.value.detail


def test_a_key_set_in_two_files_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "budgets: {bm25_ms: 100}\n")
    write(tmp_path, "b.yaml", "budgets: {dense_ms: 100}\n")
    with pytest.raises(GatewayError, match="already set in a.yaml"):
        load_policy(tmp_path)


def test_version_is_a_content_hash(tmp_path: Path) -> None:
    write(tmp_path, "p.yaml", "budgets: {bm25_ms: 100}\n")
    first = load_policy(tmp_path).version
    assert load_policy(tmp_path).version == first
    write(tmp_path, "p.yaml", "budgets: {bm25_ms: 101}\n")
    assert load_policy(tmp_path).version != first


def test_policy_check_cli(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["policy", "check", "policies"]).exit_code == 0
    bad = write(tmp_path / "bad", "p.yaml", "regions: {global_readable: maybe}\n")
    result = runner.invoke(cli, ["policy", "check", str(bad)])
    assert result.exit_code == 1 and "regions.global_readable" in result.output
