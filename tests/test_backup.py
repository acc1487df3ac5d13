"""`gateway backup DEST`: a copy of a data dir made while a server serves and writes on it,
which a server started on the copy serves as the data dir was at the backup."""

from __future__ import annotations

import re
import resource
import sqlite3
import subprocess
import threading
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from gateway.bench.server import gateway_command
from gateway.cli import app as cli
from tests.helpers.datadirs import copy_data_dir
from tests.helpers.identity import bearer
from tests.helpers.processes import gateway_env, run_gateway, running_server, served_env

QUERY = {"query": "RPL-14"}  # finds refund-policy, as a key of acme's staff in EU


def create_key(env: dict[str, str], name: str) -> tuple[str, str]:
    """A search key of acme's staff in EU: (its ID, the token)."""
    made = run_gateway("keys", "create", "--tenant", "acme", "--region", "EU", "--principal",
                       "group:staff", "--name", name, env=env)  # fmt: skip
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1]
    return token.split("_")[1], token


def found(base: str, token: str) -> tuple[int, list[str]]:
    """The status of a search with `token`, and the documents it found."""
    response = httpx.post(f"{base}/search", json=QUERY, headers=bearer(token), timeout=30)
    results = response.json().get("results", []) if response.status_code == 200 else []
    return response.status_code, [r["doc_id"] for r in results]


@pytest.mark.server
def test_a_backup_made_while_a_server_writes_is_served_as_it_was(
    tmp_path: Path, data_dir: Path, jwks_file: Path
) -> None:
    """The documented `cp -a` of a served data dir could copy catalog.db and then a WAL
    restarted by the server's own writes (audit records) meanwhile: the copy lost committed
    changes, a key revoked before it worked again, and its /readyz still said ready."""
    live, copy = copy_data_dir(data_dir, tmp_path / "live"), tmp_path / "backup"
    env = served_env(live, jwks_file)
    with running_server(env) as (base, _process):
        revoked_before, revoked_before_token = create_key(env, "revoked-before")
        revoked_after, revoked_after_token = create_key(env, "revoked-after")
        # Revoked while the server holds the catalog open: the revocation is in its WAL.
        assert run_gateway("keys", "revoke", revoked_before, env=env).returncode == 0
        assert found(base, revoked_before_token)[0] == 401
        generation = httpx.get(f"{base}/readyz").json()["index_generation"]

        statuses: list[int] = []  # the server's searches (each an audit record) meanwhile
        stop = threading.Event()

        def search_until_stopped() -> None:
            while not stop.is_set():
                statuses.append(found(base, revoked_after_token)[0])

        searches = threading.Thread(target=search_until_stopped, daemon=True)
        searches.start()
        try:
            backed_up = run_gateway("backup", str(copy), env=env)
        finally:
            stop.set()
            searches.join(timeout=60)
        assert backed_up.returncode == 0, backed_up.stderr
        assert f"generation {generation}," in backed_up.stdout
        assert statuses and set(statuses) == {200}  # served throughout

        # After the backup, on the live data dir only.
        assert run_gateway("keys", "revoke", revoked_after, env=env).returncode == 0
        assert run_gateway("delete", "refund-policy", env=env).returncode == 0
        assert found(base, revoked_after_token)[0] == 401

    checked = sqlite3.connect(copy / "catalog.db")
    try:
        assert checked.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        checked.close()
    keys = run_gateway("keys", "list", "--data-dir", str(copy), env=gateway_env()).stdout
    assert re.search(rf"{revoked_before}\s+revoked", keys), keys  # there, and revoked
    assert re.search(rf"{revoked_after}\s+active", keys), keys
    with running_server(served_env(copy, jwks_file)) as (restored, _process):
        assert httpx.get(f"{restored}/readyz").json()["index_generation"] == generation
        assert found(restored, revoked_before_token)[0] == 401  # stays revoked
        status, documents = found(restored, revoked_after_token)  # as at the backup
        assert status == 200 and documents[0] == "refund-policy"


def limit_file_size(size: int) -> None:
    """A disk that takes no file past `size` bytes, without root: a write beyond it fails
    with EFBIG, and Python ignores the SIGXFSZ that comes with it."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))


@pytest.mark.server
def test_a_backup_that_fails_says_why_and_leaves_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    create_key(gateway_env(GATEWAY_DATA_DIR=str(data)), "bot")
    catalog_size = (data / "catalog.db").stat().st_size
    copy = tmp_path / "backup"
    failed = subprocess.run(
        [gateway_command(), "backup", str(copy), "--data-dir", str(data)],
        env=gateway_env(), capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: limit_file_size(catalog_size // 2),
    )  # fmt: skip
    assert failed.returncode == 1
    assert "backup failed copying the catalog (SQLITE_" in failed.stderr, failed.stderr
    assert "Traceback" not in failed.stderr
    assert not copy.exists()


def test_a_backup_goes_only_where_it_belongs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    key = ["keys", "create", "--tenant", "acme", "--region", "EU", "--principal", "group:bot"]
    made = CliRunner().invoke(cli, [*key, "--data-dir", str(data)])
    assert made.exit_code == 0, made.output
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "kept.txt").write_text("an earlier backup\n")
    for dest, said in [
        (data / "backups" / "today", "is inside the data dir"),
        (data, "is inside the data dir"),
        (tmp_path / "full", "exists and is not an empty directory"),
    ]:
        result = CliRunner().invoke(cli, ["backup", str(dest), "--data-dir", str(data)])
        assert result.exit_code == 1 and said in result.output, result.output
    assert not (data / "backups").exists()
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["kept.txt"]


@pytest.mark.parametrize(
    ("setting", "value", "said"),
    [
        ("GATEWAY_DATABASE_URL", "postgresql+psycopg://gw@db.example/gw", "pg_dump"),
        ("GATEWAY_INDEX_URI", "s3://bucket/index", "snapshot the store's prefix"),
    ],
)
def test_a_catalog_or_index_elsewhere_is_refused_with_what_to_do(
    tmp_path: Path, setting: str, value: str, said: str
) -> None:
    result = CliRunner().invoke(
        cli, ["backup", str(tmp_path / "backup"), "--data-dir", str(tmp_path / "data")],
        env={setting: value},
    )  # fmt: skip
    assert result.exit_code == 1 and said in result.output, result.output
    assert not (tmp_path / "backup").exists()
