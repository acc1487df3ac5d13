"""The embedding handover and the job queue under faults no exception reports: a slice
that kills every embedder that takes it (out of memory, say) is left to the writer after
MAX_EMBEDDER_CLAIMS claims, with a warning naming it, instead of going round embedders for
ever; a claim handed back in order costs the slice nothing; handover rows of ended jobs
are swept when the writer starts; a job failed at its writer's start loses its slices in
the same commit, even to a plan racing with it (PostgreSQL); and transient failures of a
job count in a row only, an outage in between starting the count again. Real catalog
(SQLite, or a real PostgreSQL), claim path and model."""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, col, select, text, update

from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.ingest.embedder import EmbedOnly
from gateway.ingest.pipeline import ingest_paths
from gateway.ingest.worker import MAX_TRANSIENT_TRIES, IngestWorker
from gateway.policy.loader import load_policy
from gateway.storage.catalog import Catalog
from gateway.storage.jobs import MAX_ATTEMPTS, JobResult, JobRow
from gateway.storage.layout import DataLayout
from gateway.storage.slices import MAX_EMBEDDER_CLAIMS, PlannedSlice, SliceRow, claim_token
from tests.helpers.documents import write_corpus
from tests.helpers.policies import write_policy
from tests.helpers.postgres import Cluster
from tests.test_embed_handover import SLICE, squad


class Killed(BaseException):
    """The process dies: no `except Exception` of the embedder sees it (no give-up, no
    release), as with SIGKILL from the kernel's OOM killer."""


class DiesOnEmbed(Embedder):
    """The model, in a process that is killed whenever it embeds."""

    def __init__(self, model: Embedder) -> None:
        self.__dict__.update(model.__dict__)

    def embed_with_spans(self, *args: Any, **kwargs: Any) -> Any:
        raise Killed


def setup(tmp_path: Path, embedder: Embedder) -> tuple[DataLayout, Any]:
    layout = DataLayout(tmp_path / "data")
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    policy_dir = write_policy(tmp_path / "policy", ingest={"slice_chunks": SLICE})
    return layout, lambda: load_policy(policy_dir).policy


def slices(catalog: Catalog) -> list[SliceRow]:
    with Session(catalog.engine) as s:
        return list(s.exec(select(SliceRow)).all())


def expire_claims(catalog: Catalog) -> None:
    """Every claim's heartbeat stopped two minutes ago (its process is dead)."""
    old = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=2)
    with Session(catalog.engine) as s:
        s.exec(update(SliceRow).where(col(SliceRow.status) == "claimed").values(heartbeat_at=old))
        s.commit()


def test_a_slice_that_kills_its_embedders_goes_to_the_writer_after_a_few_claims(
    tmp_path: Path, embedder: Embedder, caplog: pytest.LogCaptureFixture
) -> None:
    layout, policy = setup(tmp_path, embedder)
    writer = IngestWorker(layout, embedder, policy, claim_timeout_s=60)
    doomed = EmbedOnly(layout.open_catalog(), DiesOnEmbed(embedder), policy, 60)
    job = writer.catalog.jobs.submit("acme", "a", squad("acme", 2), 10)
    for _ in range(MAX_EMBEDDER_CLAIMS):  # each embedder that claims it dies on it
        with pytest.raises(Killed):
            doomed.run_once()
        expire_claims(writer.catalog)
    assert doomed.run_once() == 0  # no embedder claims it again (it would die again)
    (planned,) = slices(writer.catalog)
    assert writer.catalog.slices.tenants_open(60) == {}
    with caplog.at_level(logging.WARNING, logger="gateway.worker"):
        while writer.run_once():
            pass
    row = writer.catalog.jobs.job("acme", job.job_id)
    assert row is not None and row.status == "succeeded" and row.chunks == planned.chunks
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        f"slice {planned.id} of job {job.job_id}" in w and "the writer embeds it" in w
        for w in warnings
    ), warnings


def test_a_claim_handed_back_in_order_costs_the_slice_nothing(tmp_path: Path) -> None:
    """An embedder stopping in order (SIGTERM), or whose catalog is away, releases its
    claims: not a claim that ended without a result."""
    catalog = DataLayout(tmp_path / "data").open_catalog()
    job = catalog.jobs.submit("acme", "a", [{"doc_id": "d"}], 10)
    catalog.slices.plan(job.job_id, job.seq or 0, "acme", "{}", [PlannedSlice(("k",), 1)])
    for _ in range(MAX_EMBEDDER_CLAIMS + 1):
        token = claim_token("embedder")
        assert catalog.slices.claim(token, 60, 10, tenant="acme", embedder=True)
        catalog.slices.release(token)
    (row,) = slices(catalog)
    assert row.status == "open" and row.embedder_claims == 0
    assert catalog.slices.claim(claim_token("embedder"), 60, 10, tenant="acme", embedder=True)


def test_handover_rows_of_ended_jobs_are_swept_when_the_writer_starts(
    tmp_path: Path, embedder: Embedder
) -> None:
    """Rows an earlier release left behind its ended jobs go at the writer's start, not
    only once it claims a job."""
    layout, policy = setup(tmp_path, embedder)
    catalog = layout.open_catalog()
    ended = catalog.jobs.submit("acme", "a", [{"doc_id": "d"}], 10)
    assert [j.job_id for j in catalog.jobs.claim(1)] == [ended.job_id]
    catalog.jobs.finish_unchanged([JobResult(ended.job_id, 0, 1)], None)
    queued = catalog.jobs.submit("acme", "a", [{"doc_id": "e"}], 10)
    with Session(catalog.engine) as s:
        for job in (ended, queued):
            s.add(SliceRow(job_id=job.job_id, job_seq=job.seq or 0, tenant="acme", ordinal=0,
                           keys_json="[]", chunking="{}", chunks=1))  # fmt: skip
        s.commit()
    writer = IngestWorker(layout, embedder, policy, claim_timeout_s=60)
    writer.resume()
    assert [r.job_id for r in slices(catalog)] == [queued.job_id]


class Flickers(Embedder):
    """The model, behind services that fail some of its tries: `flicker` fails one and
    the catalog answers just after (counted against the job); `outage` fails one and the
    catalog does not answer the writer's check just after (a real outage)."""

    def __init__(self, model: Embedder, script: list[str], catalog: Catalog) -> None:
        self.__dict__.update(model.__dict__)
        self.script = script
        self.catalog_away = False
        real = catalog.current_generation_id

        def answers() -> int | None:
            if self.catalog_away:
                self.catalog_away = False
                raise GatewayError("catalog_unavailable", "the catalog database is away")
            return real()

        catalog.current_generation_id = answers  # type: ignore[method-assign]

    def embed_with_spans(self, *args: Any, **kwargs: Any) -> Any:
        if self.script:
            self.catalog_away = self.script.pop(0) == "outage"
            raise GatewayError("catalog_unavailable", "the catalog database is away")
        return super().embed_with_spans(*args, **kwargs)


def test_transient_failures_of_a_job_count_in_a_row_an_outage_starts_again(
    tmp_path: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More blips than MAX_TRANSIENT_TRIES in all, around a real outage, but fewer in a
    row: the job was unlucky, not at fault, and is written."""
    monkeypatch.setattr("gateway.ingest.worker.UNAVAILABLE_WAIT_S", 0.0)
    layout, policy = setup(tmp_path, embedder)
    writer = IngestWorker(layout, embedder, policy)
    blips = MAX_TRANSIENT_TRIES - 2
    script = ["flicker"] * blips + ["outage"] + ["flicker"] * blips
    flickers = Flickers(embedder, script, writer.catalog)
    writer.embedder = flickers
    job = writer.catalog.jobs.submit("acme", "a", squad("acme", 1), 10)

    def ended() -> bool:
        row = writer.catalog.jobs.job("acme", job.job_id)
        return row is not None and row.status in ("succeeded", "failed")

    writer.run(ended)
    row = writer.catalog.jobs.job("acme", job.job_id)
    assert row is not None and row.status == "succeeded", row and row.errors
    assert flickers.script == [] and row.attempts == 1  # each try given back


@pytest.mark.server  # PostgreSQL: row locks decide the race
def test_a_job_failed_at_the_writers_start_takes_a_racing_plan_with_it(
    postgres: Cluster, tmp_path: Path
) -> None:
    """An embedder plans a job (its slices inserted, the job's row held FOR SHARE, not
    committed yet) while a starting writer fails that job for its interruptions: the
    writer's commit must delete those slices, or they stay with an ended job."""
    catalog = DataLayout(tmp_path / "data", postgres.new_database()).open_catalog()
    job = catalog.jobs.submit("acme", "a", [{"doc_id": "d"}], 10)
    with Session(catalog.engine) as s:  # interrupted as often as a job may be
        s.exec(update(JobRow).values(status="running", attempts=MAX_ATTEMPTS))
        s.commit()
    with Session(catalog.engine) as planner:  # `EmbedSlices.plan`, up to its commit
        planner.add(SliceRow(job_id=job.job_id, job_seq=job.seq or 0, tenant="acme",
                             ordinal=0, keys_json="[]", chunking="{}", chunks=1))  # fmt: skip
        planner.flush()
        alive = planner.exec(
            select(JobRow.job_id).where(col(JobRow.job_id) == job.job_id).with_for_update(read=True)
        ).first()
        assert alive is not None
        outcome: list[tuple[int, int]] = []
        writer = threading.Thread(target=lambda: outcome.append(catalog.jobs.resume_interrupted()))
        writer.start()
        while not waiting_for_a_lock(catalog):  # the writer's update waits for the plan
            assert writer.is_alive()
            time.sleep(0.01)
        planner.commit()
    writer.join()
    assert outcome == [(0, 1)]
    assert slices(catalog) == []


def waiting_for_a_lock(catalog: Catalog) -> bool:
    with catalog.engine.connect() as connection:
        waiting = connection.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        ).scalar()
    return bool(waiting)
