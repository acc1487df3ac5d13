"""Commands that read or change a data dir's content fail clearly where they found none,
and report what they did not finish with a non-zero exit."""

from __future__ import annotations

import errno
import resource
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

import gateway.authn.apikeys as apikeys
import gateway.cli.erase as erase_command
from gateway.bench.server import gateway_command
from gateway.cli import app as cli
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.ingest.pipeline import delete_versions, ingest_paths
from gateway.storage.layout import DataLayout
from tests.helpers.datadirs import copy_data_dir
from tests.helpers.documents import write_corpus
from tests.helpers.policies import write_policy
from tests.helpers.processes import gateway_env, run_gateway


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


KEY = ["keys", "create", "--tenant", "acme", "--region", "EU", "--principal", "group:bot"]


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        (GatewayError("catalog_unavailable", "away"), "catalog_unavailable: away"),
        (OSError(errno.ENOSPC, "No space left on device", "/d/catalog.db-wal"),
         "No space left on device: /d/catalog.db-wal"),
        (OSError(errno.EXDEV, "Invalid cross-device link", "/d/a", None, "/e/b"),
         "Invalid cross-device link: /d/a -> /e/b"),
    ],
)  # fmt: skip
def test_an_expected_failure_ends_any_command_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raised: Exception, said: str
) -> None:
    """Raised where the command does not catch it, it printed a traceback whose message
    was withheld: exit 1, and nothing said why."""

    def create_key(*args: object, **kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(apikeys, "create_key", create_key)
    result = CliRunner().invoke(cli, [*KEY, "--data-dir", str(tmp_path)])
    assert result.exit_code == 1 and result.output == f"{said}\n"


# The engines' own words for a full disk, as a write under a file-size limit of 0 gave
# them (Tantivy: ValueError; LanceDB: RuntimeError), with errno 28 for 27.
ENGINE_FULL_DISK = [
    ValueError(
        "Failed to open file for write: 'IoError { io_error: Custom { kind: StorageFull, "
        'error: PathError { path: "/d/t/.tmpKioxUm", err: Os { code: 28, kind: StorageFull, '
        'message: "No space left on device" } } }, filepath: "8f23.fieldnorm" }\''
    ),
    RuntimeError(
        "lance error: LanceError(IO): No space left on device (os error 28), "
        "/root/.cargo/registry/src/lance-file-13.0.0/src/writer/structural.rs:258:9"
    ),
]


@pytest.mark.parametrize(
    "raised",
    [*ENGINE_FULL_DISK, ValueError("Syntax Error: title:(")],
    ids=["tantivy", "lancedb", "not-the-systems"],
)
def test_an_index_engine_on_a_full_disk_ends_ingest_with_the_systems_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raised: Exception
) -> None:
    """The engines raise the system's error as their own exception: a traceback, its
    message withheld, was all ingest showed. An engine's other errors are bugs, and keep
    their traceback."""
    from gateway.ingest import pipeline

    def ingest_documents(*args: object, **kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(pipeline, "ingest_documents", ingest_documents)
    doc = tmp_path / "refunds.md"
    doc.write_text("# Refunds\n\nRefunds are paid within five days.\n")
    args = ["--tenant", "acme", "--region", "EU", "--acl", "group:x"]
    args += ["--effective-from", "2026-01-01", "--data-dir", str(tmp_path / "data")]
    result = CliRunner().invoke(cli, ["ingest", str(doc), *args])
    if raised not in ENGINE_FULL_DISK:
        assert result.exception is raised
        return
    assert result.exit_code == 1, result.output
    assert result.output.endswith(
        "No space left on device (writing or reading the index's files)\n"
    ), result.output


@pytest.mark.parametrize(
    "raised",
    [
        RuntimeError("a bug"),
        OSError("a library's own words"),
        KeyboardInterrupt(),
    ],
    ids=["bug", "oserror-without-errno", "ctrl-c"],
)
def test_a_bug_and_ctrl_c_are_not_taken_for_expected_failures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, raised: BaseException
) -> None:
    def create_key(*args: object, **kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(apikeys, "create_key", create_key)
    result = CliRunner().invoke(cli, [*KEY, "--data-dir", str(tmp_path)])
    if isinstance(raised, KeyboardInterrupt):  # click's own ending: 128 + SIGINT, as before
        assert result.exit_code == 130
    else:  # a traceback, its message withheld (`exceptions.install`)
        assert result.exception is raised


def full_disk() -> None:
    """No file may grow: a write fails with EFBIG (Python ignores its SIGXFSZ). Unlike a
    read-only catalog, it holds for root too."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))


@pytest.mark.server
def test_keys_create_on_a_full_disk_says_why(tmp_path: Path) -> None:
    made = run_gateway(*KEY, "--data-dir", str(tmp_path), env=gateway_env())
    assert made.returncode == 0, made.stderr
    # A server on the data dir keeps the catalog's shared memory and WAL files, so that
    # opening the catalog writes nothing and the key's insert is the first write to fail.
    server = sqlite3.connect(tmp_path / "catalog.db")
    try:
        server.execute("SELECT count(*) FROM api_keys").fetchone()
        failed = subprocess.run(
            [gateway_command(), *KEY, "--data-dir", str(tmp_path)],
            env=gateway_env(), capture_output=True, text=True, timeout=120,
            preexec_fn=full_disk,
        )  # fmt: skip
    finally:
        server.close()
    assert failed.returncode == 1
    assert failed.stderr == "catalog_unavailable: the catalog's disk failed (I/O error)\n"


@pytest.mark.server
def test_delete_failing_on_the_data_dir_names_the_path(tmp_path: Path, data_dir: Path) -> None:
    """An error of the system once the catalog is open (here a file where the vector
    copies' directory belongs) ends with what the system said and the path."""
    live = copy_data_dir(data_dir, tmp_path / "data")
    shutil.rmtree(live / "flat")
    (live / "flat").write_text("not a directory\n")
    failed = run_gateway("delete", "refund-policy", "--data-dir", str(live), env=gateway_env())
    assert failed.returncode == 1
    assert failed.stderr == f"File exists: {live / 'flat'}\n"
