"""The handover table's claims on SQLite and on a real PostgreSQL: claimers racing in
threads never take one slice twice; a claim expires with its heartbeat; a plan is made
once; a job's slices go with the transaction that ends it."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

import pytest
from sqlmodel import Session, col, select, update

from gateway.storage.catalog import Catalog
from gateway.storage.jobs import JobResult
from gateway.storage.layout import DataLayout
from gateway.storage.slices import EMBEDDED, PlannedSlice, SliceRow, claim_token
from tests.helpers.postgres import Cluster

SLICES = 40


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.server)])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Catalog:
    url = None
    if request.param == "postgres":
        cluster: Cluster = request.getfixturevalue("postgres")
        url = cluster.new_database()
    return DataLayout(tmp_path / "data", url).open_catalog()


def queued_job(catalog: Catalog) -> tuple[str, int]:
    record = {"doc_id": "d", "version": "1", "title": "", "text": "x", "region": "EU",
              "acl": ["group:staff"], "effective_from": "2020-01-01"}  # fmt: skip
    row = catalog.jobs.submit("acme", "test", [record], 10)
    return row.job_id, row.seq or 0


def test_racing_claimers_take_each_slice_once(catalog: Catalog) -> None:
    job_id, seq = queued_job(catalog)
    planned = [PlannedSlice((f"k{n}",), 1) for n in range(SLICES)]
    assert catalog.slices.plan(job_id, seq, "acme", "{}", planned)
    assert not catalog.slices.plan(job_id, seq, "acme", "{}", planned)  # planned once
    taken: list[int] = []
    lock = threading.Lock()

    def claimer() -> None:
        while rows := catalog.slices.claim(claim_token("embedder"), 60, 2, tenant="acme"):
            with lock:
                taken.extend(r.id or 0 for r in rows)

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(taken) == sorted(set(taken)) and len(taken) == SLICES


def test_a_claim_expires_with_its_heartbeat_and_is_handed_over_once(catalog: Catalog) -> None:
    job_id, seq = queued_job(catalog)
    catalog.slices.plan(job_id, seq, "acme", "{}", [PlannedSlice(("k",), 3)])
    first = claim_token("embedder")
    (row,) = catalog.slices.claim(first, 60, 10, jobs=[job_id])
    assert catalog.slices.claim(claim_token("embedder"), 60, 10, jobs=[job_id]) == []
    with Session(catalog.engine) as s:  # its heartbeat stopped two minutes ago
        old = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=2)
        s.exec(update(SliceRow).where(col(SliceRow.id) == row.id).values(heartbeat_at=old))
        s.commit()
    second = claim_token("writer")
    assert [r.id for r in catalog.slices.claim(second, 60, 10, jobs=[job_id])] == [row.id]
    assert not catalog.slices.hand_over(row.id or 0, first, None)  # the first lost it
    assert catalog.slices.hand_over(row.id or 0, second, None)
    assert catalog.slices.state([job_id])[0].status == EMBEDDED


def test_a_new_writer_opens_a_dead_writers_claims_at_once_and_no_embedders(
    catalog: Catalog,
) -> None:
    """The lease proves an earlier writer gone (killed with -9, say): its claims need not
    wait out the timeout. An embedder's claim, alive or not, keeps its own."""
    job_id, seq = queued_job(catalog)
    planned = [PlannedSlice(("w",), 1), PlannedSlice(("e",), 1)]
    catalog.slices.plan(job_id, seq, "acme", "{}", planned)
    (by_writer,) = catalog.slices.claim(claim_token("writer"), 60, 1, jobs=[job_id])
    (by_embedder,) = catalog.slices.claim(claim_token("embedder"), 60, 1, jobs=[job_id])
    assert catalog.slices.release_writers_claims() == 1
    again = catalog.slices.claim(claim_token("writer"), 60, 10, jobs=[job_id])
    assert [r.id for r in again] == [by_writer.id]  # open again; the embedder's is not


def test_a_jobs_slices_go_with_its_commit_or_failure(catalog: Catalog) -> None:
    done, seq = queued_job(catalog)
    failed, seq2 = queued_job(catalog)
    catalog.slices.plan(done, seq, "acme", "{}", [PlannedSlice(("k",), 1)])
    catalog.slices.plan(failed, seq2, "acme", "{}", [PlannedSlice(("j",), 1)])
    catalog.jobs.finish_unchanged([JobResult(done, 0, 1)], None)
    catalog.jobs.fail([failed], [])
    with Session(catalog.engine) as s:
        assert s.exec(select(SliceRow)).all() == []
