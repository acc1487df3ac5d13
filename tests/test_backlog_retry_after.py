"""The Retry-After of a tenant's 429 `ingest_backlog` comes from that tenant's own jobs.

Before, it was the mean time of the last 20 jobs of every tenant, so one tenant's
Retry-After told it how long another tenant's ingests took (invariant 13).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from gateway.api.app import create_app
from gateway.authn.apikeys import create_key
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.storage.jobs import JobRow
from gateway.storage.layout import DataLayout
from tests.helpers.documents import doc, write_corpus
from tests.helpers.identity import bearer, make_settings
from tests.helpers.policies import write_policy

NO_HISTORY_S = 5  # what a tenant without a finished job is told


@pytest.fixture
def gateway(
    tmp_path: Path, embedder: Embedder, jwks_file: Path
) -> Iterator[tuple[TestClient, DataLayout]]:
    """A server without its writer (pushed jobs stay queued) that queues one job a tenant."""
    layout = DataLayout(tmp_path / "data")
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    policy_dir = write_policy(tmp_path / "policy", ingest={"max_pending_jobs": 1})
    settings = make_settings(layout.root, jwks_file, policy_dir)
    with TestClient(create_app(settings, embedder=embedder)) as client:
        yield client, layout


def finished_jobs(layout: DataLayout, tenant: str, seconds: int, count: int = 20) -> None:
    """`count` succeeded jobs of `tenant` that took `seconds` each, as the writer leaves them
    (durations a test cannot wait for)."""
    jobs = layout.open_catalog().jobs
    end = dt.datetime.now(dt.UTC)
    with Session(jobs.engine) as s:
        for n in range(count):
            s.add(
                JobRow(
                    job_id=f"{tenant}-done-{n}",
                    tenant=tenant,
                    submitted_by=f"key:{tenant}",
                    documents=1000,
                    records_json="[]",
                    status="succeeded",
                    created_at=end,
                    started_at=end - dt.timedelta(seconds=seconds),
                    finished_at=end,
                )
            )
        s.commit()


def retry_after_of_a_full_queue(client: TestClient, layout: DataLayout) -> str:
    key, _ = create_key(
        layout.open_catalog(), tenant="acme", region="EU", principals=[], scope="ingest"
    )
    first = client.post("/admin/documents", json={"documents": [doc("q-1")]}, headers=bearer(key))
    assert first.status_code == 202, first.text
    refused = client.post("/admin/documents", json={"documents": [doc("q-2")]}, headers=bearer(key))
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "ingest_backlog"
    return str(refused.headers["retry-after"])


def test_another_tenants_slow_jobs_do_not_set_your_retry_after(
    gateway: tuple[TestClient, DataLayout],
) -> None:
    client, layout = gateway
    finished_jobs(layout, "globex", seconds=250)
    assert retry_after_of_a_full_queue(client, layout) == str(NO_HISTORY_S)


def test_your_own_jobs_set_your_retry_after_whatever_others_ran_since(
    gateway: tuple[TestClient, DataLayout],
) -> None:
    client, layout = gateway
    finished_jobs(layout, "acme", seconds=12)
    finished_jobs(layout, "globex", seconds=250)  # newer: the last 20 jobs are all globex's
    assert retry_after_of_a_full_queue(client, layout) == "12"
