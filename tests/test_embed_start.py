"""`gateway worker --embed-only` at start, as a real process: on an index of another model
it refuses with the reason (invariant 12) and exit 1; a catalog it cannot reach yet is
waited for, not a crash."""

from __future__ import annotations

import subprocess
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text

from gateway.bench.server import gateway_command
from gateway.embedding import Embedder
from tests.helpers.documents import seed
from tests.helpers.policies import write_policy
from tests.helpers.postgres import Cluster
from tests.helpers.processes import gateway_env, logged_command, wait_for_line

pytestmark = [pytest.mark.server, pytest.mark.sleeps]


def test_an_embedder_on_an_index_of_another_model_says_why_it_refuses(
    tmp_path: Path, embedder: Embedder
) -> None:
    layout = seed(tmp_path, embedder)
    with layout.open_catalog().engine.begin() as connection:
        connection.execute(text("UPDATE generations SET model_name = 'other/model'"))
    policy_dir = write_policy(tmp_path / "policy")
    result = subprocess.run(
        [gateway_command(), "worker", "--embed-only", "--data-dir", str(layout.root)],
        env=gateway_env(GATEWAY_POLICY_DIR=str(policy_dir)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert "index_mismatch: " in result.stderr and "other/model" in result.stderr
    assert "gateway reindex" in result.stderr
    assert "withheld" not in result.stderr


def test_an_embedder_waits_for_a_catalog_it_cannot_reach_yet(
    tmp_path: Path, postgres: Cluster
) -> None:
    """A database that is not there yet stands for one briefly away: the embedder retries
    until it is, then starts."""
    url = postgres.new_database()
    admin, name = url.rsplit("/", 1)
    later = f"{admin}/{name}_later"
    env = gateway_env(
        GATEWAY_DATA_DIR=str(tmp_path / "data"),
        GATEWAY_DATABASE_URL=later,
        GATEWAY_POLICY_DIR=str(write_policy(tmp_path / "policy")),
    )
    log = tmp_path / "embedder.log"
    with logged_command(["worker", "--embed-only"], env, log) as process:
        # The reason the catalog gave is in the line (a full disk says so).
        reason = "the catalog database cannot be reached; retry shortly"
        wait_for_line(log, process, f"catalog_unavailable ({reason}); retrying")
        with psycopg.connect(postgres.admin_url, autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}_later")
        wait_for_line(log, process, "embedder ready")
