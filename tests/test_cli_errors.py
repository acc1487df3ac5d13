"""Commands that read or change a data dir's content fail clearly where they found none,
and report what they did not finish with a non-zero exit."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import gateway.cli.erase as erase_command
from gateway.cli import app as cli
from gateway.embedding import Embedder
from gateway.ingest.pipeline import delete_versions, ingest_paths
from gateway.storage.layout import DataLayout
from tests.helpers.documents import write_corpus
from tests.helpers.policies import write_policy


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_a_mistyped_data_dir_is_named_not_made(tmp_path: Path) -> None:
    """Each of these made an empty catalog in the mistyped directory and reported on it:
    `policy diff --fail-on-widen` said "widens: no" and exited 0 (a CI gate turned green)."""
    missing = str(tmp_path / "dataa")
    policy = str(write_policy(tmp_path / "policy"))
    for command in (
        ["policy", "diff", policy, policy, "--fail-on-widen"],
        ["keys", "list"],
        ["keys", "revoke", "0123456789abcdef"],
        ["audit", "export", "--tenant", "acme"],
        ["erase", "--tenant", "acme"],
        ["tenant", "delete", "--tenant", "acme", "--yes"],
    ):
        code, output = run(*command, "--data-dir", missing)
        assert code == 1, (command, output)
        assert f"no catalog in {missing}" in output, (command, output)
    assert not Path(missing).exists()
    code, output = run("keys", "create", "--tenant", "acme", "--region", "EU", "--principal",
                       "group:bot", "--data-dir", missing)  # fmt: skip
    assert code == 0 and "created search key" in output  # a first key may come first


def test_erase_with_json_exits_1_when_replicas_hold_it_back(
    tmp_path: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replicas still behind after the wait give exit 1 (docs/operations.md, "Erasing:
    `gateway erase`, `gateway tenant delete`"); with --json
    the report said "done": false and the command exited 0."""
    layout = DataLayout(tmp_path / "data")
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    delete_versions(layout, "acme", "refund-policy")
    layout.open_catalog().replicas.report(1)  # a replica serving generation 1 all along
    monkeypatch.setattr(erase_command, "WAIT_FOR_REPLICAS_S", 0.0)  # it will not catch up
    code, output = run("erase", "--tenant", "acme", "--wait", "--json", "--data-dir",
                       str(layout.root))  # fmt: skip
    assert code == 1 and '"done": false' in output


def test_a_port_out_of_range_is_refused_not_wrapped() -> None:
    """`serve --port 70000` listened on 4464 (70000 mod 65536) while its log said 70000."""
    for command in ("serve", "demo"):
        code, output = run(command, "--port", "70000")
        assert code == 2 and "--port" in output and "65535" in output, output


def test_a_worker_says_why_its_policy_does_not_load(tmp_path: Path) -> None:
    """It showed a traceback whose message was withheld: the operator never saw why."""
    missing = str(tmp_path / "no-policy")
    result = CliRunner().invoke(
        cli, ["worker", "--data-dir", str(tmp_path / "data")], env={"GATEWAY_POLICY_DIR": missing}
    )
    assert result.exit_code == 1 and "invalid_policy" in result.output, result.output
    assert missing in result.output
