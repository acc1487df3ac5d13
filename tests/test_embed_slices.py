"""The handover table's claims on SQLite and on a real PostgreSQL: claimers racing in
threads never take one slice twice; a claim expires with its heartbeat; a plan is made
once, and never for a job that ended; a job's slices go with the transaction that ends it;
an erasure clears the vectors of versions deleted from a queued job and cancels a claim
that may still hand them over."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

import pytest
from sqlmodel import Session, col, select, update

from gateway.domain import version_key
from gateway.ingest.erasure import erase
from gateway.ingest.pipeline import delete_versions
from gateway.storage.catalog import Catalog
from gateway.storage.jobs import JobResult
from gateway.storage.layout import DataLayout
from gateway.storage.slices import EMBEDDED, Handover, PlannedSlice, SliceRow, claim_token
from tests.helpers.postgres import Cluster

SLICES = 40


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.server)])
def layout(request: pytest.FixtureRequest, tmp_path: Path) -> DataLayout:
    url = None
    if request.param == "postgres":
        cluster: Cluster = request.getfixturevalue("postgres")
        url = cluster.new_database()
    return DataLayout(tmp_path / "data", url)


@pytest.fixture
def catalog(layout: DataLayout) -> Catalog:
    return layout.open_catalog()


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


def test_a_plan_for_a_job_that_ended_meanwhile_is_not_inserted(catalog: Catalog) -> None:
    """An embedder that read the job as queued, then planned it after the writer had
    committed it (and deleted its slices), must leave no row nothing would delete."""
    job_id, seq = queued_job(catalog)
    assert [j.job_id for j in catalog.jobs.claim(10, tenant="acme")] == [job_id]
    catalog.jobs.finish_unchanged([JobResult(job_id, 0, 1)], None)
    assert catalog.jobs.counts() == {"succeeded": 1}
    assert not catalog.slices.plan(job_id, seq, "acme", "{}", [PlannedSlice(("k",), 1)])
    with Session(catalog.engine) as s:
        assert s.exec(select(SliceRow)).all() == []
    assert catalog.slices.tenants_open(60) == {}
    # Rows an earlier release left so: swept (the writer does, as it starts).
    other, other_seq = queued_job(catalog)
    with Session(catalog.engine) as s:
        for job, n in ((job_id, other_seq), (other, other_seq)):
            s.add(SliceRow(job_id=job, job_seq=n, tenant="acme", ordinal=0, keys_json="[]",
                           chunking="{}", chunks=1))  # fmt: skip
        s.commit()
    assert catalog.slices.sweep() == 1
    assert catalog.slices.planned([job_id, other]) == {other}  # a queued job's stay


def handover(chunk_ids: list[str]) -> Handover:
    """An embedder's result for these chunks (4-dimensional, bytes standing for vectors)."""
    n = len(chunk_ids)
    vectors, digests, sentences = b"v" * 16 * n, b"d" * 16 * n, b"s" * 8 * n
    return Handover("m", 4, "float32", chunk_ids, digests, vectors, [8] * n, sentences)


def test_an_erasure_clears_handed_over_vectors_of_versions_deleted_from_a_queued_job(
    layout: DataLayout, catalog: Catalog
) -> None:
    records = [
        {"doc_id": d, "version": "1", "title": "", "text": "x", "region": "EU",
         "acl": ["group:staff"], "effective_from": "2020-01-01"}
        for d in ("a", "b", "c")
    ]  # fmt: skip
    job = catalog.jobs.submit("acme", "test", records, 10)
    a, b, c = (version_key("acme", d, "1") for d in ("a", "b", "c"))
    planned = [PlannedSlice((a, b), 2), PlannedSlice((c,), 1)]
    assert catalog.slices.plan(job.job_id, job.seq or 0, "acme", "{}", planned)
    done, flight = claim_token("embedder"), claim_token("embedder")
    (first,) = catalog.slices.claim(done, 60, 2, jobs=[job.job_id], embedder=True)
    assert catalog.slices.hand_over(first.id or 0, done, handover([f"{a}:0", f"{b}:0"]))
    (second,) = catalog.slices.claim(flight, 60, 2, jobs=[job.job_id], embedder=True)

    delete_versions(layout, "acme", "a")  # from the queued job: an erasure is requested
    delete_versions(layout, "acme", "c")
    report = erase(layout, ann_min_rows=10_000)
    assert report.done

    with Session(catalog.engine) as s:
        rows = {r.id: r for r in s.exec(select(SliceRow)).all()}
    cleared, emptied = rows[first.id], rows[second.id]
    assert cleared.keys == [b] and cleared.status == "open"  # b is embedded again
    assert (cleared.vectors, cleared.digests, cleared.sentence_vectors) == (None, None, None)
    assert cleared.chunk_ids_json is None and cleared.claimed_by is None
    assert emptied.keys == [] and emptied.status == EMBEDDED and emptied.chunks == 0
    # The embedder that was embedding c read it before the delete: its handover is refused.
    assert not catalog.slices.hand_over(second.id or 0, flight, handover([f"{c}:0"]))
    assert catalog.slices.state([job.job_id])[0].keys == [b]
    assert report.slices_cleared == 2
