"""The writer `gateway serve` runs is supervised: killed, it is restarted (with backoff)
and writes the jobs queued meanwhile; a writer that keeps dying makes the server not ready;
`/metrics` tells whether it is up and how often it was restarted. Real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.authn.apikeys import create_key
from gateway.cli.worker import stop_worker
from gateway.embedding import Embedder
from gateway.ingest.supervisor import WriterSupervisor
from tests.helpers.documents import doc, seed
from tests.helpers.identity import AUDIENCE, ISSUER, bearer, make_settings
from tests.helpers.policies import write_policy
from tests.helpers.processes import children, gateway_env, running_server, until

pytestmark = pytest.mark.server


def test_a_killed_writer_is_restarted_and_writes_the_queued_job(
    tmp_path: Path, embedder: Embedder, jwks_file: Path
) -> None:
    layout = seed(tmp_path, embedder)
    key, _ = create_key(
        layout.open_catalog(), tenant="acme", region="EU", principals=[], scope="ingest"
    )
    env = gateway_env(
        GATEWAY_DATA_DIR=str(layout.root),
        GATEWAY_OIDC_ISSUER=ISSUER,
        GATEWAY_OIDC_AUDIENCE=AUDIENCE,
        GATEWAY_JWKS_URI=jwks_file.as_uri(),
    )
    with (
        running_server(env, worker=True) as (base, server),
        httpx.Client(base_url=base, timeout=60) as client,
    ):
        assert "gateway_writer_up 1.0" in client.get("/metrics").text
        (writer,) = children(server.pid)
        os.kill(writer, signal.SIGKILL)
        until(lambda: writer not in children(server.pid))
        queued = client.post(
            "/admin/documents", json={"documents": [doc("after-kill")]}, headers=bearer(key)
        )
        assert queued.status_code == 202, queued.text

        def written() -> bool:
            job = client.get(queued.headers["location"], headers=bearer(key)).json()
            return bool(job["status"] == "succeeded")

        until(written)
        (restarted,) = children(server.pid)
        assert restarted != writer
        metrics = client.get("/metrics").text
        assert "gateway_writer_up 1.0" in metrics
        assert "gateway_writer_restarts_total 1.0" in metrics
        assert client.get("/readyz").status_code == 200


def dies_at_once() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])


def test_a_writer_that_keeps_dying_makes_the_server_not_ready(
    tmp_path: Path, embedder: Embedder, jwks_file: Path
) -> None:
    layout = seed(tmp_path, embedder)
    settings = make_settings(layout.root, jwks_file, write_policy(tmp_path / "policy"))
    writer = WriterSupervisor(dies_at_once, stop_worker, first_backoff_s=0.05)
    with TestClient(create_app(settings, embedder=embedder, writer=writer)) as client:
        writer.start()
        try:
            until(lambda: writer.restarts >= 3 and not writer.up, seconds=30)
            not_ready = client.get("/readyz")
            assert not_ready.status_code == 503
            assert "writer" in not_ready.json()["detail"]
            metrics = client.get("/metrics").text
            assert "gateway_writer_up 0.0" in metrics
            assert "gateway_writer_restarts_total" in metrics
        finally:
            writer.stop()


def test_a_writer_that_stays_up_is_not_restarted() -> None:
    writer = WriterSupervisor(
        lambda: subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]),
        stop_worker,
    )
    writer.start()
    try:
        assert writer.up and writer.healthy() and writer.restarts == 0
        first = writer.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        until(lambda: writer.restarts == 1 and writer.up, seconds=30)
        assert writer.pid != first and writer.healthy()  # one death is not a crash loop
    finally:
        writer.stop()
    assert not writer.up
