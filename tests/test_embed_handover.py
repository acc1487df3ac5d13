"""Embedding apart from the committer, turn by turn in one process: an embed-only loop
plans and embeds slices of queued jobs and hands them over in the catalog; the writer takes
them instead of embedding, embeds what nobody handed over, refuses vectors of another
model or chunking (or, when forced to float32, of other numerics), takes over a claim
whose heartbeat stopped, embeds one large document a slice a turn between other tenants'
turns, takes at once a slice an embedder failed on, and deletes the handover with the
job's commit. Real catalog, engines and model (the processes: test_embed_workers)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, col, select, update

from gateway.embedding import Embedder
from gateway.ingest.embedder import EmbedOnly
from gateway.ingest.pipeline import ingest_paths
from gateway.ingest.worker import IngestWorker
from gateway.policy.loader import load_policy
from gateway.storage.layout import DataLayout
from gateway.storage.slices import SliceRow, claim_token
from tests.helpers.documents import SQUAD_SLICE, write_corpus
from tests.helpers.policies import write_policy

SLICE = 8  # chunks a slice; the SQuAD paragraphs are one to three chunks each


class Counted:
    """Counts the chunks an embedder embeds, by process role (`calls`: each call's)."""

    def __init__(self, embedder: Embedder, monkeypatch: pytest.MonkeyPatch) -> None:
        self.texts = 0
        self.calls: list[int] = []
        real = embedder.embed_with_spans

        def counting(texts: Sequence[str], *args: Any, **kwargs: Any) -> Any:
            self.texts += len(texts)
            self.calls.append(len(texts))
            return real(texts, *args, **kwargs)

        monkeypatch.setattr(embedder, "embed_with_spans", counting)


def squad(tenant: str, count: int, start: int = 0) -> list[dict[str, Any]]:
    lines = SQUAD_SLICE.read_text().splitlines()[start : start + count]
    out = []
    for line in lines:
        passage = json.loads(line)
        out.append(
            {
                "doc_id": passage["_id"],
                "version": "1",
                "title": passage["title"],
                "text": passage["text"],
                "tenant": tenant,
                "region": "EU",
                "acl": ["group:staff"],
                "effective_from": "2020-01-01",
            }
        )
    return out


@pytest.fixture
def parts(tmp_path: Path, embedder: Embedder) -> tuple[IngestWorker, EmbedOnly]:
    layout = DataLayout(tmp_path / "data")
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    policy_dir = write_policy(tmp_path / "policy", ingest={"slice_chunks": SLICE})

    def policy() -> Any:
        return load_policy(policy_dir).policy

    writer = IngestWorker(layout, embedder, policy, claim_timeout_s=0.5)
    return writer, EmbedOnly(layout.open_catalog(), embedder, policy, claim_timeout_s=0.5)


def slices(writer: IngestWorker) -> list[SliceRow]:
    with Session(writer.catalog.engine) as s:
        return list(s.exec(select(SliceRow)).all())


def drain(writer: IngestWorker) -> None:
    while writer.run_once():
        pass


def test_the_writer_takes_handed_over_vectors_and_embeds_nothing_again(
    parts: tuple[IngestWorker, EmbedOnly], embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, embed_only = parts
    jobs = [writer.catalog.jobs.submit("acme", "a", squad("acme", 12, n * 12), 10) for n in (0, 1)]
    counted = Counted(embedder, monkeypatch)
    while embed_only.run_once():
        pass
    handed = counted.texts
    planned = sum(s.chunks for s in slices(writer))
    assert handed == planned > 12  # every chunk once, in several slices
    assert {s.status for s in slices(writer)} == {"embedded"}

    drain(writer)
    assert counted.texts == handed  # the writer embedded nothing itself
    for job in jobs:
        row = writer.catalog.jobs.job("acme", job.job_id)
        assert row is not None and row.status == "succeeded"
    assert slices(writer) == []  # gone with the commit
    generation = writer.catalog.current_generation()
    assert generation is not None and embedder.numerics.label in generation.precisions
    chunk_id = writer.catalog.chunks_of("acme", "p00023", "1")[0].chunk_id
    sentences = writer.catalog.chunk_rows("acme", [chunk_id])[chunk_id].sentence_vectors
    assert sentences and len(sentences) % (2 * embedder.dim) == 0  # float16 rows, handed over


def test_without_embedders_the_writer_embeds_every_slice_itself(
    parts: tuple[IngestWorker, EmbedOnly], embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, _ = parts
    job = writer.catalog.jobs.submit("acme", "a", squad("acme", 10), 10)
    counted = Counted(embedder, monkeypatch)
    drain(writer)
    row = writer.catalog.jobs.job("acme", job.job_id)
    assert row is not None and row.status == "succeeded" and row.chunks == counted.texts
    assert slices(writer) == []


def test_vectors_of_another_model_or_chunking_are_refused_and_embedded_again(
    parts: tuple[IngestWorker, EmbedOnly],
    embedder: Embedder,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    writer, embed_only = parts
    job = writer.catalog.jobs.submit("acme", "a", squad("acme", 10), 10)
    while embed_only.run_once():
        pass
    first, second, *_ = sorted(slices(writer), key=lambda s: s.ordinal)
    with Session(writer.catalog.engine) as s:
        s.exec(update(SliceRow).where(col(SliceRow.id) == first.id).values(model_name="other"))
        s.exec(update(SliceRow).where(col(SliceRow.id) == second.id).values(chunking="{}"))
        s.commit()
    counted = Counted(embedder, monkeypatch)
    with caplog.at_level(logging.ERROR, logger="gateway.worker"):
        drain(writer)
    assert counted.texts == first.chunks + second.chunks  # those two again, nothing else
    assert any("refusing the vectors" in r.getMessage() for r in caplog.records)
    row = writer.catalog.jobs.job("acme", job.job_id)
    assert row is not None and row.status == "succeeded"


@pytest.mark.sleeps
def test_a_claim_whose_heartbeat_stopped_is_taken_over_once(
    parts: tuple[IngestWorker, EmbedOnly], embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, embed_only = parts
    job = writer.catalog.jobs.submit("acme", "a", squad("acme", 10), 10)
    embed_only.plan_new(embed_only.policy())
    dead = claim_token("embedder")  # an embedder that claims a slice, then dies
    taken = writer.catalog.slices.claim(dead, 0.5, SLICE, tenant="acme")
    assert len(taken) == 1
    other = writer.catalog.slices.claim(claim_token("embedder"), 0.5, SLICE, jobs=[job.job_id])
    assert [s.id for s in other] != [s.id for s in taken]  # a claimed slice is not claimed again
    writer.catalog.slices.release(other[0].claimed_by or "")
    time.sleep(0.6)  # its claim expires
    counted = Counted(embedder, monkeypatch)
    drain(writer)
    row = writer.catalog.jobs.job("acme", job.job_id)
    assert row is not None and row.status == "succeeded"
    assert counted.texts == row.chunks  # each chunk once, the dead one's included
    assert not writer.catalog.slices.hand_over(taken[0].id or 0, dead, None)  # too late


def test_one_large_document_is_embedded_a_slice_a_turn_between_other_tenants(
    tmp_path: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slice is planned of whole versions, so one large document is one slice: the
    writer embeds `slice_chunks` of it a turn, keeping its claim meanwhile (no embedder
    takes the rest), so another tenant's one-chunk job waits for one turn, not for the
    whole document (docs/operations.md, "gateway worker")."""
    layout = DataLayout(tmp_path / "data")
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    policy_dir = write_policy(tmp_path / "policy", ingest={"slice_chunks": SLICE})
    writer = IngestWorker(
        layout, embedder, lambda: load_policy(policy_dir).policy, claim_timeout_s=60
    )
    paragraphs = [json.loads(line)["text"] for line in SQUAD_SLICE.read_text().splitlines()[:30]]
    big = {**squad("a", 1)[0], "doc_id": "big", "text": "\n\n".join(paragraphs)}
    job_a = writer.catalog.jobs.submit("a", "x", [big], 10)
    job_b = writer.catalog.jobs.submit("b", "x", squad("b", 1, 40), 10)
    counted = Counted(embedder, monkeypatch)

    writer.run_once()  # tenant a: the first slice of its document
    assert counted.texts == SLICE
    (held,) = slices(writer)
    assert held.status == "claimed" and held.chunks > 3 * SLICE  # one slice, the writer's
    assert writer.catalog.slices.claim(claim_token("embedder"), 60, SLICE, embedder=True) == []
    writer.run_once()  # tenant b's turn: its job is written now
    row_b = writer.catalog.jobs.job("b", job_b.job_id)
    assert row_b is not None and row_b.status == "succeeded"
    assert counted.texts == SLICE + row_b.chunks

    drain(writer)
    row_a = writer.catalog.jobs.job("a", job_a.job_id)
    assert row_a is not None and row_a.status == "succeeded" and row_a.chunks == held.chunks
    assert counted.texts == row_a.chunks + row_b.chunks  # each chunk once
    assert max(counted.calls) <= SLICE
    assert slices(writer) == []


def test_a_slice_that_fails_in_an_embedder_is_left_to_the_writer_at_once(
    tmp_path: Path, embedder: Embedder, caplog: pytest.LogCaptureFixture
) -> None:
    """An embedder-only fault (here an older embedder that cannot read the chunking
    options a newer planner recorded) gives the slice up at once: no embedder takes it
    again, and the writer embeds it without waiting out the claim timeout."""
    layout = DataLayout(tmp_path / "data")
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    policy_dir = write_policy(tmp_path / "policy", ingest={"slice_chunks": SLICE})

    def policy() -> Any:
        return load_policy(policy_dir).policy

    writer = IngestWorker(layout, embedder, policy, claim_timeout_s=60)
    first, second = (EmbedOnly(layout.open_catalog(), embedder, policy, 60) for _ in range(2))
    job = writer.catalog.jobs.submit("acme", "a", squad("acme", 3), 10)
    first.plan_new(policy())
    (planned,) = slices(writer)
    newer = {**json.loads(planned.chunking), "an_option_of_a_newer_release": 1}
    with Session(writer.catalog.engine) as s:
        s.exec(update(SliceRow).values(chunking=json.dumps(newer)))
        s.commit()

    with caplog.at_level(logging.ERROR, logger="gateway.embedder"):
        assert first.run_once() == 0  # failed, and gave the slice up
        assert second.run_once() == 0  # not taken again by an embedder
    failures = [r for r in caplog.records if r.name == "gateway.embedder"]
    assert len(failures) == 1 and "left to the writer" in failures[0].getMessage()
    (given_up,) = slices(writer)
    assert given_up.status == "open"

    started = time.monotonic()
    drain(writer)
    assert time.monotonic() - started < 30  # not after the 60 s claim timeout
    row = writer.catalog.jobs.job("acme", job.job_id)
    assert row is not None and row.status == "succeeded" and row.chunks == planned.chunks


@pytest.mark.model  # its own two embedders, not the session's
def test_a_writer_forced_to_float32_embeds_again_vectors_handed_over_in_bfloat16(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """`GATEWAY_EMBEDDING_PRECISION=float32` at the writer is full precision for every
    vector it commits: an embedder's bfloat16 vectors are embedded again, not adopted."""
    full, half = Embedder(precision="float32"), Embedder(precision="bfloat16")
    layout = DataLayout(tmp_path / "data")
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, full)
    policy_dir = write_policy(tmp_path / "policy", ingest={"slice_chunks": SLICE})

    def policy() -> Any:
        return load_policy(policy_dir).policy

    writer = IngestWorker(layout, full, policy, claim_timeout_s=60)
    embed_only = EmbedOnly(layout.open_catalog(), half, policy, claim_timeout_s=60)
    job = writer.catalog.jobs.submit("acme", "a", squad("acme", 6), 10)
    while embed_only.run_once():
        pass
    handed = slices(writer)
    assert {s.numerics for s in handed} == {"bfloat16"}
    counted = Counted(full, monkeypatch)
    with caplog.at_level(logging.INFO, logger="gateway.worker"):
        drain(writer)
    row = writer.catalog.jobs.job("acme", job.job_id)
    assert row is not None and row.status == "succeeded"
    assert counted.texts == row.chunks == sum(s.chunks for s in handed)  # all of them again
    generation = writer.catalog.current_generation()
    assert generation is not None and generation.precisions == "float32"
    assert any("other numerics than the forced float32" in r.getMessage() for r in caplog.records)
