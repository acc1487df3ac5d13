"""Policy files: strict parsing, clear problems, a content-hash version, and `policy check`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.cli import app as cli
from gateway.errors import GatewayError
from gateway.policy.loader import load_policy, policy_schema


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


def test_checked_in_schema_matches_the_models() -> None:
    checked_in = Path(__file__).resolve().parents[1] / "policies" / "schema.json"
    assert checked_in.read_text() == policy_schema(), "run `make schema` and commit it"
    schema = json.loads(checked_in.read_text())
    assert schema["additionalProperties"] is False  # unknown keys are refused
    assert {"nested_groups", "grants", "regions", "admins", "budgets"} <= set(schema["properties"])


def test_every_problem_in_every_file_is_named(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "regions: {global_readable: maybe}\nbypass: true\n")
    write(tmp_path, "b.yaml", "budgets: [not, a, mapping\n")
    write(tmp_path, "c.yaml", "- a list\n")
    write(tmp_path, "d.yaml", "regions: {}\nadmins: {groups: [ops], roles: [x]}\n")
    with pytest.raises(GatewayError) as error:
        load_policy(tmp_path)
    lines = error.value.detail.splitlines()
    expected = [
        ("b.yaml", "not valid YAML"),
        ("c.yaml", "top level must be a mapping"),
        ("d.yaml", "regions: already set in a.yaml"),
        ("a.yaml", "regions.global_readable"),
        ("a.yaml", "bypass"),
        ("d.yaml", "admins.roles"),
    ]
    for name, words in expected:
        assert any(name in line and words in line for line in lines), (name, words, lines)
    result = CliRunner().invoke(cli, ["policy", "check", str(tmp_path)])
    assert result.exit_code == 1
    assert all(name in result.output for name in ("a.yaml", "b.yaml", "c.yaml", "d.yaml"))


@pytest.mark.parametrize("text", ["", "\n  \n", "# budgets: {bm25_ms: 100}\n"])
def test_an_empty_policy_file_is_refused_not_taken_for_every_default(
    tmp_path: Path, text: str
) -> None:
    """An emptied file (a failed deploy, a truncating editor) is a mistake far more often
    than a wish for every default; `{}` states the wish."""
    write(tmp_path, "a.yaml", "budgets: {bm25_ms: 100}\n")
    write(tmp_path, "policy.yaml", text)
    with pytest.raises(GatewayError) as error:
        load_policy(tmp_path)
    assert error.value.detail == (
        f"{tmp_path / 'policy.yaml'}: empty (no YAML document); write {{}} for a file that "
        "sets nothing"
    )
    write(tmp_path, "policy.yaml", "{}\n")
    assert load_policy(tmp_path).policy.budgets.bm25_ms == 100


def test_a_policy_file_that_cannot_be_read_is_named_with_the_other_problems(
    tmp_path: Path,
) -> None:
    """A directory named like a policy file (a backup, `old.yaml/`) or a file gone
    mid-deploy is a problem of the policy, reported as one: not a crash."""
    write(tmp_path, "a.yaml", "regions: {global_readable: maybe}\n")
    (tmp_path / "old.yaml").mkdir()
    with pytest.raises(GatewayError) as error:
        load_policy(tmp_path)
    lines = error.value.detail.splitlines()
    assert f"{tmp_path / 'old.yaml'}: cannot be read (Is a directory)" in lines
    assert any("a.yaml" in line and "regions.global_readable" in line for line in lines)
    result = CliRunner().invoke(cli, ["policy", "check", str(tmp_path)])
    assert result.exit_code == 1 and "old.yaml: cannot be read" in result.output


@pytest.mark.parametrize("directory", ["missing", "file.yaml"])
def test_a_directory_that_is_not_one_is_refused(tmp_path: Path, directory: str) -> None:
    (tmp_path / "file.yaml").write_text("budgets: {}\n")
    result = CliRunner().invoke(cli, ["policy", "check", str(tmp_path / directory)])
    assert result.exit_code == 1 and "not a directory" in result.output
