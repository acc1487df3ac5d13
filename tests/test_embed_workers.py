"""Embedding workers apart from the committer, as real processes on one data dir (its
catalog on SQLite, or on a real PostgreSQL): two
`gateway worker --embed-only` and one `gateway worker` write queued jobs whole, every
chunk embedded once (counted from each process's log line per slice) and in the index
once, generations in the order the jobs came; an embedder killed with -9 mid-slice leaves
its claim to expire, and the slice is embedded by another process, once."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from sqlmodel import Session, col, select

from gateway.bench.server import gateway_command
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.ingest.records import record_of
from gateway.ingest.sources import load_documents
from gateway.restriction import Restriction
from gateway.storage.catalog import Catalog
from gateway.storage.jobs import JobRow
from gateway.storage.layout import DataLayout, open_served
from gateway.storage.slices import SliceRow
from tests.helpers.documents import TODAY, big_batch, seed
from tests.helpers.policies import write_policy
from tests.helpers.postgres import Cluster
from tests.helpers.processes import gateway_env

pytestmark = [pytest.mark.server, pytest.mark.sleeps, pytest.mark.long]
STAFF = Restriction("acme", frozenset({"group:staff"}), frozenset({"EU"}), TODAY)
EMBEDDER_LINE = re.compile(r"embedded slice \d+ of job \S+: (\d+) chunks")
WRITER_LINE = re.compile(r"writer embedded (\d+) chunks")


@contextmanager
def worker(
    layout: DataLayout, policy_dir: Path, log: Path, *args: str, **settings: str
) -> Iterator[subprocess.Popen[bytes]]:
    env = gateway_env(
        GATEWAY_DATA_DIR=str(layout.root), GATEWAY_POLICY_DIR=str(policy_dir), **settings
    )
    with log.open("wb") as out:
        process = subprocess.Popen(
            [gateway_command(), "worker", *args], env=env, stdout=out, stderr=out
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                process.terminate()
                process.wait(timeout=60)


def embedded(log: Path, line: re.Pattern[str]) -> list[int]:
    return [int(m.group(1)) for m in line.finditer(log.read_text())]


def submit(catalog: Catalog, tmp_path: Path, batches: int, size: int) -> list[str]:
    paths = big_batch(tmp_path / "bulk.jsonl", batches * size)
    records = [record_of(d) for d in load_documents([paths])]
    return [
        catalog.jobs.submit("acme", "test", records[n * size : (n + 1) * size], 100).job_id
        for n in range(batches)
    ]


def wait_done(catalog: Catalog, job_ids: Sequence[str], seconds: float) -> list[JobRow]:
    deadline = time.monotonic() + seconds
    while True:
        rows = [catalog.jobs.job("acme", j) for j in job_ids]
        if all(r is not None and r.status in ("succeeded", "failed") for r in rows):
            return [r for r in rows if r is not None]
        assert time.monotonic() < deadline, "the jobs never finished"
        time.sleep(0.2)


def check_written(layout: DataLayout, catalog: Catalog, rows: Sequence[JobRow], docs: int) -> int:
    """Every job succeeded, generations in the order of the jobs, every document's chunks
    in both engines once, and nothing of the handover left; the chunks written."""
    assert [r.status for r in rows] == ["succeeded"] * len(rows), [r.errors for r in rows]
    generations = [r.index_generation or 0 for r in rows]
    assert generations == sorted(generations)  # commits single and ordered
    chunk_ids = {
        c.chunk_id for n in range(docs) for c in catalog.chunks_of("acme", f"bulk-{n}", "1")
    }
    written = sum(r.chunks for r in rows)
    assert len(chunk_ids) == written and all(
        catalog.document("acme", f"bulk-{n}", "1") for n in range(docs)
    )
    index = open_served(layout, catalog, "sentence-transformers/all-MiniLM-L6-v2", 384)
    assert index is not None
    assert chunk_ids <= index.lexical.filter_only(STAFF)
    assert chunk_ids <= index.vectors.filter_only(STAFF)
    assert index.vectors.count() == written + 2  # each chunk once, beside the seed's two
    with Session(catalog.engine) as s:
        assert s.exec(select(SliceRow)).all() == []
    return written


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest) -> dict[str, str]:
    """The catalog's settings: SQLite in the data dir, or a database on a real PostgreSQL."""
    if request.param == "sqlite":
        return {}
    cluster: Cluster = request.getfixturevalue("postgres")
    return {"GATEWAY_DATABASE_URL": cluster.new_database()}


def test_two_embedders_and_the_writer_embed_each_chunk_once(
    tmp_path: Path, embedder: Embedder, database: dict[str, str]
) -> None:
    layout = seed(tmp_path, embedder)
    if database:  # the same two seed documents, in a catalog on PostgreSQL
        layout = DataLayout(tmp_path / "pg-data", database["GATEWAY_DATABASE_URL"])
        ingest_paths([tmp_path / "docs"], layout, embedder)
    catalog = layout.open_catalog()
    policy_dir = write_policy(tmp_path / "policy", ingest={"slice_chunks": 12})
    logs = [tmp_path / f"{name}.log" for name in ("e1", "e2", "writer")]
    with ExitStack() as stack:
        for log in logs[:2]:
            stack.enter_context(worker(layout, policy_dir, log, "--embed-only", **database))
        job_ids = submit(catalog, tmp_path, batches=4, size=20)
        # The writer comes once the embedders are at work: all three embed, then.
        deadline = time.monotonic() + 120
        while not all(embedded(log, EMBEDDER_LINE) for log in logs[:2]):
            assert time.monotonic() < deadline, [log.read_text()[-2000:] for log in logs]
            time.sleep(0.2)
        stack.enter_context(worker(layout, policy_dir, logs[2], **database))
        rows = wait_done(catalog, job_ids, 300)
    written = check_written(layout, catalog, rows, 80)
    by_embedders = [sum(embedded(log, EMBEDDER_LINE)) for log in logs[:2]]
    by_writer = sum(embedded(logs[2], WRITER_LINE))
    assert all(by_embedders)
    assert sum(by_embedders) + by_writer == written  # each chunk's vector embedded once


def test_an_embedder_killed_mid_slice_leaves_it_to_another_once(
    tmp_path: Path, embedder: Embedder
) -> None:
    layout = seed(tmp_path, embedder)
    catalog = layout.open_catalog()
    policy_dir = write_policy(tmp_path / "policy", ingest={"slice_chunks": 48})
    timeout = {"GATEWAY_EMBED_CLAIM_TIMEOUT_S": "20"}
    logs = [tmp_path / f"{name}.log" for name in ("doomed", "e2", "writer")]
    job_ids = submit(catalog, tmp_path, batches=2, size=30)
    with worker(layout, policy_dir, logs[0], "--embed-only", **timeout) as doomed:
        deadline = time.monotonic() + 120
        while not claimed(catalog):
            assert doomed.poll() is None and time.monotonic() < deadline, logs[0].read_text()
            time.sleep(0.02)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
    assert not embedded(logs[0], EMBEDDER_LINE)  # killed before it handed anything over
    with ExitStack() as stack:
        stack.enter_context(worker(layout, policy_dir, logs[1], "--embed-only", **timeout))
        stack.enter_context(worker(layout, policy_dir, logs[2], **timeout))
        rows = wait_done(catalog, job_ids, 300)
    written = check_written(layout, catalog, rows, 60)
    again = sum(embedded(logs[1], EMBEDDER_LINE)) + sum(embedded(logs[2], WRITER_LINE))
    assert again == written  # the dead one's slice once more, nothing twice


def claimed(catalog: Catalog) -> bool:
    with Session(catalog.engine) as s:
        return bool(s.exec(select(SliceRow.id).where(col(SliceRow.status) == "claimed")).all())
