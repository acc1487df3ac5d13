"""The writer shares itself between tenants: jobs are claimed tenant by tenant, embedded a
slice at a time, and a tenant's small job is written after at most one slice of another
tenant's backlog; each tenant's queue is bounded in bytes, for that tenant alone. Real
catalog, real engines, the real writer (run here turn by turn)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.authn.apikeys import create_key
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.ingest.worker import IngestWorker
from gateway.policy.loader import load_policy
from gateway.storage.jobs import JobQueue
from gateway.storage.layout import DataLayout
from tests.helpers.documents import doc, write_corpus
from tests.helpers.identity import bearer, make_settings
from tests.helpers.policies import write_policy

SLICE = 2  # chunks embedded per turn; each document below is one chunk


def records(tenant: str, prefix: str, count: int) -> list[dict[str, Any]]:
    return [{**doc(f"{prefix}-{n}"), "tenant": tenant} for n in range(count)]


def status(jobs: JobQueue, tenant: str, job_id: str) -> tuple[str, int | None]:
    row = jobs.job(tenant, job_id)
    assert row is not None
    return row.status, row.index_generation


@pytest.fixture
def writer(tmp_path: Path, embedder: Embedder) -> IngestWorker:
    layout = DataLayout(tmp_path / "data")
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    policy_dir = write_policy(tmp_path / "policy", ingest={"slice_chunks": SLICE})
    return IngestWorker(layout, embedder, lambda: load_policy(policy_dir).policy)


def test_a_small_job_is_written_before_another_tenants_backlog_finishes(
    writer: IngestWorker,
) -> None:
    jobs = writer.catalog.jobs
    backlog = [jobs.submit("acme", "bulk", records("acme", f"bulk{j}", 3), 10) for j in range(3)]
    small = jobs.submit("globex", "one", records("globex", "urgent", 1), 10)

    turns = 0
    while status(jobs, "globex", small.job_id)[0] != "succeeded":
        assert writer.run_once() > 0
        turns += 1
    assert turns == 2  # one slice of acme's backlog, then globex's job
    assert {status(jobs, "acme", j.job_id)[0] for j in backlog} == {"running"}
    assert writer.catalog.document("acme", "bulk0-0", "1") is None  # nothing half written

    while writer.run_once():
        pass
    _, urgent_generation = status(jobs, "globex", small.job_id)
    ended = [status(jobs, "acme", j.job_id) for j in backlog]
    assert {state for state, _ in ended} == {"succeeded"}
    # acme's backlog is one claim (one tenant's jobs coalesce), one generation, after globex's.
    assert len({generation for _, generation in ended}) == 1
    assert urgent_generation is not None and urgent_generation < ended[0][1]  # type: ignore[operator]
    assert writer.catalog.document("acme", "bulk2-2", "1") is not None


def test_tenants_take_turns_round_robin(writer: IngestWorker) -> None:
    jobs = writer.catalog.jobs
    first = jobs.submit("acme", "a", records("acme", "a", 4), 10)  # two slices
    second = jobs.submit("globex", "b", records("globex", "b", 4), 10)
    third = jobs.submit("initech", "c", records("initech", "c", 1), 10)
    finished: list[str] = []
    while writer.run_once():
        for tenant, job in (("acme", first), ("globex", second), ("initech", third)):
            if status(jobs, tenant, job.job_id)[0] == "succeeded" and tenant not in finished:
                finished.append(tenant)
    # a1, b1, c (written), a2 (written), b2 (written)
    assert finished == ["initech", "acme", "globex"]


def test_a_stopped_writer_hands_back_or_resumes_its_claims_whole(writer: IngestWorker) -> None:
    jobs = writer.catalog.jobs
    big = jobs.submit("acme", "bulk", records("acme", "bulk", 5), 10)
    turns = iter(range(1))
    writer.run(lambda: next(turns, None) is None)  # one turn (a slice), then stop in order
    row = jobs.job("acme", big.job_id)
    assert row is not None and (row.status, row.attempts) == ("queued", 0)  # handed back

    writer.run_once()  # a slice, then the writer dies: the next one resumes the job
    successor = IngestWorker(writer.layout, writer.embedder, writer.policy)
    assert successor.resume() == (1, 0)
    while successor.run_once():
        pass
    assert status(jobs, "acme", big.job_id)[0] == "succeeded"
    assert all(writer.catalog.document("acme", f"bulk-{n}", "1") for n in range(5))


@pytest.fixture
def server(tmp_path: Path, embedder: Embedder, jwks_file: Path) -> Iterator[TestClient]:
    layout = DataLayout(tmp_path / "data")
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    policy_dir = write_policy(tmp_path / "policy", ingest={"max_pending_bytes": 1500})
    settings = make_settings(layout.root, jwks_file, policy_dir)
    with TestClient(create_app(settings, embedder=embedder)) as client:
        yield client


def test_a_tenant_over_its_byte_quota_is_429_while_another_is_queued(
    server: TestClient,
) -> None:
    catalog = server.app.state.gateway.catalog  # type: ignore[attr-defined]
    keys = {
        tenant: create_key(catalog, tenant=tenant, region="EU", principals=[], scope="ingest")[0]
        for tenant in ("acme", "globex")
    }

    def push(tenant: str, prefix: str, count: int) -> Any:
        body = {"documents": [doc(f"{prefix}-{n}") for n in range(count)]}
        return server.post("/admin/documents", json=body, headers=bearer(keys[tenant]))

    assert push("acme", "big", 8).status_code == 202  # alone, over the quota: taken
    refused = push("acme", "more", 1)
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "ingest_backlog"
    assert "max_pending_bytes" in refused.json()["detail"]
    assert int(refused.headers["retry-after"]) >= 1
    assert push("globex", "other", 1).status_code == 202  # another tenant's queue is its own
    assert catalog.jobs.counts() == {"queued": 2}
