"""Supersession across pushes: whatever order versions arrive in, and however often a start
is sent again, exactly the latest-starting version that has started is in force (invariant
4: a superseded version is never evidence). Run through the push API and the real writer,
and, for random sequences, through the writer against a simple model."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.domain import Document, Visibility
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_documents
from gateway.ingest.worker import IngestWorker
from gateway.ingest.writer import ChangeSet, Plan, write_generation
from gateway.storage.catalog import Revision
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ALICE
from tests.helpers.documents import day, doc
from tests.helpers.identity import TokenFactory, bearer
from tests.helpers.push_app import push_app


@pytest.fixture
def pushed(
    tmp_path: Path, embedder: Embedder, jwks_file: Path
) -> Iterator[tuple[TestClient, IngestWorker, str]]:
    """A server, its writer (run by the test after each push), an ingest key."""
    with push_app(tmp_path, embedder, jwks_file) as app:
        yield app


def push(client: TestClient, writer: IngestWorker, key: str, version: str, start: int) -> str:
    """The ID of the job that pushed `version`, once written."""
    text = f"The zebra rule version {version} says ZR-{version}."
    pushed = doc("zebra-rule", version=version, text=text, effective_from=day(start))
    response = client.post("/admin/documents", json={"documents": [pushed]}, headers=bearer(key))
    assert response.status_code == 202, response.text
    assert writer.run_once() == 1
    return str(response.json()["job_id"])


@pytest.mark.parametrize(
    ("pushes", "in_force", "until"),
    [
        # 2 arrives between 1 and 3: 1 now ends the day before 2 starts, not before 3.
        ([("1", -100), ("3", 10), ("2", -10)], "2", day(9)),
        # 2 sent again starting later: 1 is in force again until then.
        ([("1", -100), ("2", -10), ("2", 10)], "1", day(9)),
        # 2 sent again starting earlier: 1 ends the day before 2's new start.
        ([("1", -100), ("2", 10), ("2", -10)], "2", None),
    ],
    ids=["between-two", "start-moved-later", "start-moved-earlier"],
)
def test_exactly_the_latest_started_version_is_in_force_today(
    pushed: tuple[TestClient, IngestWorker, str],
    make_token: TokenFactory,
    pushes: Sequence[tuple[str, int]],
    in_force: str,
    until: str | None,
) -> None:
    client, writer, key = pushed
    for version, start in pushes:
        push(client, writer, key, version, start)
    alice = bearer(make_token(**ALICE))
    response = client.post("/search", json={"query": "zebra rule", "top_k": 10}, headers=alice)
    assert response.status_code == 200, response.text
    found = {r["version"] for r in response.json()["results"] if r["doc_id"] == "zebra-rule"}
    assert found == {in_force}
    shown = client.get("/documents/zebra-rule", headers=alice)
    assert shown.status_code == 200, shown.text
    assert (shown.json()["version"], shown.json()["effective_to"]) == (in_force, until)


def test_the_newest_version_sent_again_unchanged_corrects_closures_of_an_earlier_release(
    pushed: tuple[TestClient, IngestWorker, str], make_token: TokenFactory
) -> None:
    """An earlier release closed version 1 the day before 3 starts, though 2, sent after 3,
    starts between them: 1 and 2 were both in force (CHANGELOG, migration notes). Sending
    the newest version again, unchanged, plans the closures again; once they are right,
    sending it again writes nothing."""
    client, writer, key = pushed
    for version, start in [("1", -100), ("3", 10), ("2", -10)]:
        push(client, writer, key, version, start)
    layout, alice = writer.layout, bearer(make_token(**ALICE))
    first = layout.open_catalog().document("acme", "zebra-rule", "1")
    assert first is not None
    wrong = replace(first.visibility, effective_to=dt.date.fromisoformat(day(9)))
    # Written as that release's writer wrote it: catalog and index, in one generation.
    revise = {first.key: Revision(wrong, "zebra-rule@3")}
    earlier = write_generation(layout, lambda _: Plan(ChangeSet(revise=revise))).report
    assert earlier is not None

    def found() -> set[str]:
        body = {"query": "zebra rule", "top_k": 10}
        response = client.post("/search", json=body, headers=alice)
        assert response.status_code == 200, response.text
        return {r["version"] for r in response.json()["results"] if r["doc_id"] == "zebra-rule"}

    assert found() == {"1", "2"}

    corrected = job(client, key, push(client, writer, key, "3", 10))
    assert (corrected["status"], corrected["unchanged"], corrected["chunks"]) == ("succeeded", 1, 0)
    assert corrected["index_generation"] == earlier.generation + 1
    assert found() == {"2"}
    shown = client.get("/documents/zebra-rule", headers=alice)
    assert shown.status_code == 200, shown.text
    assert (shown.json()["version"], shown.json()["effective_to"]) == ("2", day(9))
    first = layout.open_catalog().document("acme", "zebra-rule", "1")
    assert first is not None
    assert (first.effective_to, first.closed_by) == (
        dt.date.fromisoformat(day(-11)),
        "zebra-rule@2",
    )

    again = job(client, key, push(client, writer, key, "3", 10))
    assert (again["status"], again["unchanged"]) == ("succeeded", 1)
    assert again["index_generation"] == corrected["index_generation"]  # no generation spent
    assert layout.open_catalog().current_generation_id() == corrected["index_generation"]


def job(client: TestClient, key: str, job_id: str) -> dict[str, Any]:
    response = client.get(f"/admin/jobs/{job_id}", headers=bearer(key))
    assert response.status_code == 200, response.text
    return dict(response.json())


BASE = dt.date(2030, 1, 1)
STARTS = [-20, -10, -5, 0, 5, 10]  # days from BASE
VERSIONS = ["1", "2", "3", "10"]  # "10" comes after "3"
SEQUENCES = 24  # documents, each with its own random sequence of pushes
ROUNDS = 5  # pushes per document, one generation per round


def in_force_by_model(starts: dict[str, dt.date], on: dt.date) -> set[str]:
    """The latest-starting version that has started (of two starting the same day, the
    higher), from each version's last sent start."""
    started = [(start, int(version), version) for version, start in starts.items() if start <= on]
    return {max(started)[2]} if started else set()


def test_random_pushes_leave_exactly_the_model_version_in_force(
    tmp_path: Path, embedder: Embedder
) -> None:
    """Each round pushes one version (a new one, or one sent again with another start) of
    every document, in one generation; after each, every day has exactly the version the
    model says in force."""
    rng = random.Random(4)
    layout = DataLayout(tmp_path / "data")
    sent: dict[str, dict[str, dt.date]] = {f"seq-{n}": {} for n in range(SEQUENCES)}
    for _ in range(ROUNDS):
        batch = []
        for doc_id, starts in sent.items():
            version = rng.choice(VERSIONS)
            starts[version] = BASE + dt.timedelta(days=rng.choice(STARTS))
            batch.append(_document(doc_id, version, starts[version]))
        ingest_documents(batch, layout, embedder)
        rows = layout.open_catalog().versions_of(("acme", doc_id) for doc_id in sent)
        for offset in range(-25, 16):
            on = BASE + dt.timedelta(days=offset)
            for doc_id, starts in sent.items():
                stored = {
                    r.version
                    for r in rows
                    if r.doc_id == doc_id
                    and r.effective_from <= on
                    and (r.effective_to is None or on <= r.effective_to)
                }
                assert stored == in_force_by_model(starts, on), (doc_id, on, starts)


def _document(doc_id: str, version: str, start: dt.date) -> Document:
    visibility = Visibility("acme", "EU", ("group:staff",), start, None)
    text = f"Rule {doc_id} version {version}."
    return Document(doc_id, version, f"Rule {doc_id}", "", text, visibility)
