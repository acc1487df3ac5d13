"""A job whose own write the database refuses, although it answers, is failed at its
first try with the writer's reason, and the writer goes on with the queue; a real outage
still fails no job (tests/test_push_api.py::test_outages_while_a_job_runs_never_fail_it
and ::test_a_service_away_mid_job_fails_no_job_it_is_written_once_back), and transient
failures count in a row (tests/test_handover_robustness.py).

The job here is real: PostgreSQL refuses a doc_id and a version of 512 four-byte
characters each (the push API's bound) in the documents' primary key, over a B-tree
entry's 2,704 bytes (ProgramLimitExceeded, an OperationalError of the statement, not of
the connection). Before, the catalog reported it as `catalog_unavailable`, as it does for
a database that is down, and the writer handed the job back and took it again, every
second, for ever (later: for MAX_TRANSIENT_TRIES tries).

The push API now refuses such identifiers itself (1,024 bytes each:
tests/test_identifier_bounds.py), so the job here is one an earlier release queued before
the upgrade: it is failed at its first try too, naming what is wrong with it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.authn.apikeys import create_key
from gateway.embedding import Embedder
from gateway.ingest.worker import IngestWorker
from gateway.policy.loader import load_policy
from tests.helpers.documents import doc
from tests.helpers.identity import bearer
from tests.helpers.postgres import Cluster
from tests.helpers.push_app import deployment

# Distinct characters of CJK Extension B: printable, four bytes each in UTF-8.
WIDE = "".join(chr(0x20000 + (i * 7919) % 0xA6D0) for i in range(1024))
UNINDEXABLE = {"doc_id": WIDE[:512], "version": WIDE[512:]}
BOUND_S = 120.0  # the test gives up here: before, the job was never ended


@pytest.mark.server  # PostgreSQL
def test_a_job_the_database_could_not_store_is_failed_at_its_first_try(
    postgres: Cluster, tmp_path: Path, embedder: Embedder, jwks_file: Path
) -> None:
    layout, settings, policy_dir = deployment(
        tmp_path, embedder, jwks_file, postgres.new_database()
    )
    key, _ = create_key(
        layout.open_catalog(), tenant="acme", region="EU", principals=[], scope="ingest"
    )
    writer = IngestWorker(layout, embedder, lambda: load_policy(policy_dir).policy)
    with TestClient(create_app(settings, embedder=embedder)) as client:

        def pushed(document: dict[str, object]) -> str:
            queued = client.post(
                "/admin/documents", json={"documents": [document]}, headers=bearer(key)
            )
            assert queued.status_code == 202, queued.text
            return str(queued.json()["job_id"])

        def status(job_id: str) -> dict[str, object]:
            answer = client.get(f"/admin/jobs/{job_id}", headers=bearer(key))
            assert answer.status_code == 200, answer.text
            return dict(answer.json())

        # Queued as an earlier release's push API did, before its bounds in bytes.
        poison = writer.catalog.jobs.submit("acme", "key:earlier", [doc(**UNINDEXABLE)], 5).job_id
        deadline = time.monotonic() + BOUND_S
        writer.run(
            lambda: (
                time.monotonic() > deadline or status(poison)["status"] in ("succeeded", "failed")
            )
        )

        failed = status(poison)
        assert failed["status"] == "failed", failed
        [error] = failed["errors"]  # type: ignore[misc]
        assert error["message"] == (
            "invalid_document: document 0: doc_id: is 2048 bytes in UTF-8; the limit is 1024 bytes"
        )
        row = writer.catalog.jobs.job("acme", poison)
        assert row is not None and row.attempts == 1  # failed at its first try
        after = pushed(doc("pelican-after"))  # the writer goes on with the queue
        assert writer.run_once() == 1 and status(after)["status"] == "succeeded"
