"""The push API against real processes: `gateway serve` with its writer answers
`?wait=true` once the next request finds the batch, and a writer killed with -9 while a
job is embedding or committing leaves the served generation intact; the next writer
resumes the job and writes it whole."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from gateway.authn.apikeys import create_key
from gateway.bench.server import gateway_command
from gateway.embedding import Embedder
from gateway.ingest.records import record_of
from gateway.ingest.sources import load_documents
from gateway.restriction import Restriction
from gateway.storage.layout import DataLayout, open_served
from tests.helpers.callers import ALICE
from tests.helpers.documents import TODAY, big_batch, doc, seed, tree_digest
from tests.helpers.identity import AUDIENCE, ISSUER, TokenFactory, bearer
from tests.helpers.processes import Reap, gateway_env, running_server

pytestmark = [pytest.mark.server, pytest.mark.long]


def test_wait_true_answers_when_the_next_request_finds_the_batch(
    tmp_path: Path, embedder: Embedder, jwks_file: Path, make_token: TokenFactory
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
    alice = bearer(make_token(**ALICE))
    with (
        running_server(env, worker=True) as (base, _process),
        httpx.Client(base_url=base, timeout=120) as client,
    ):
        batch = {"documents": [doc("pelican-w"), doc("pelican-x")]}
        done = client.post("/admin/documents?wait=true", json=batch, headers=bearer(key))
        assert done.status_code == 200, done.text
        assert done.json()["status"] == "succeeded" and done.json()["chunks"] == 2
        found = client.post("/search", json={"query": "pelican quota"}, headers=alice)
        assert {"pelican-w", "pelican-x"} <= {r["doc_id"] for r in found.json()["results"]}

        queued = client.post(
            "/admin/documents", json={"documents": [doc("pelican-y")]}, headers=bearer(key)
        )
        assert queued.status_code == 202
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status = client.get(queued.headers["location"], headers=bearer(key)).json()
            if status["status"] == "succeeded":
                break
            time.sleep(0.1)
        assert status["status"] == "succeeded" and status["index_generation"] == 3


def start_writer(layout: DataLayout) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [gateway_command(), "worker"],
        env=gateway_env(GATEWAY_DATA_DIR=str(layout.root)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("moment", ["while embedding", "while writing the indexes"])
def test_kill_9_of_the_writer_mid_job_resumes_the_job_whole(
    tmp_path: Path, embedder: Embedder, moment: str, reap: Reap
) -> None:
    layout = seed(tmp_path, embedder)
    catalog = layout.open_catalog()
    short = moment != "while embedding"  # the embedding need not take long
    documents = load_documents([big_batch(tmp_path / "bulk.jsonl", 240, short)])
    job = catalog.jobs.submit("acme", "test", [record_of(d) for d in documents], 10)
    before = tree_digest(layout.root)
    staff = Restriction("acme", frozenset({"group:staff"}), frozenset({"EU"}), TODAY)

    writer = reap(start_writer(layout))
    deadline = time.monotonic() + 120
    if moment == "while embedding":  # the job's progress shows it under way
        while not (row := catalog.jobs.job("acme", job.job_id)) or row.chunks_done == 0:
            assert time.monotonic() < deadline, "the writer never reported embedding"
            time.sleep(0.05)
        assert row.status == "running" and row.chunks_planned is not None
        assert 0 < row.chunks_done < row.chunks_planned and row.documents_done < 240
    else:
        while not layout.lexical(2).exists():
            assert time.monotonic() < deadline, "the writer never started writing"
            time.sleep(0.005)
    assert writer.poll() is None, "the job finished before the writer could be killed"
    writer.send_signal(signal.SIGKILL)
    writer.wait()

    interrupted = catalog.jobs.job("acme", job.job_id)
    assert interrupted is not None and interrupted.status == "running"
    assert catalog.current_generation_id() == 1 and len(catalog.all_documents()) == 2
    index = open_served(layout, catalog, embedder.name, embedder.dim)
    assert index is not None and index.lexical.filter_only(staff) == {"public@1:0"}
    assert index.vectors.filter_only(staff) == {"public@1:0"}
    if moment == "while embedding":
        assert tree_digest(layout.root) == before  # not a byte of the indexes written

    writer = reap(start_writer(layout))  # resumes the job and writes all of it
    try:
        while (row := catalog.jobs.job("acme", job.job_id)) and row.status != "succeeded":
            assert row.status in ("queued", "running"), row.errors
            assert time.monotonic() < deadline + 180, "the resumed job never finished"
            time.sleep(0.1)
    finally:
        writer.send_signal(signal.SIGTERM)
        writer.wait(timeout=60)
    assert row is not None and row.attempts == 2 and row.index_generation == 2
    assert row.documents_done == 240 and row.chunks_done == row.chunks_planned == row.chunks
    assert len(catalog.all_documents()) == 242
    index = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim)
    assert index is not None
    assert len(index.lexical.filter_only(staff)) == len(index.vectors.filter_only(staff))
    assert {c.split("@")[0] for c in index.lexical.filter_only(staff)} == {
        "public",
        *(f"bulk-{n}" for n in range(240)),
    }
