"""POST /admin/documents and GET /admin/jobs/{id}: validation of whole batches, the durable
queue and its bound, and the writer that takes jobs in order (run here in-process, on the
real engines; tests/test_push_process.py runs it as `gateway serve` does)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.authn.apikeys import create_key
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.ingest.worker import IngestWorker
from gateway.storage.jobs import JobResult, job_error
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ALICE, ROOT
from tests.helpers.documents import doc
from tests.helpers.identity import TokenFactory, bearer
from tests.helpers.push_app import push_app


@pytest.fixture
def pushed(
    tmp_path: Path, embedder: Embedder, jwks_file: Path
) -> Iterator[tuple[TestClient, IngestWorker, str]]:
    """A server without its writer (jobs wait until the test runs one), an ingest key."""
    with push_app(tmp_path, embedder, jwks_file, ingest={"max_pending_jobs": 5}) as app:
        yield app


def post(client: TestClient, key: str, documents: Sequence[dict[str, Any]]) -> Any:
    return client.post("/admin/documents", json={"documents": documents}, headers=bearer(key))


def job(client: TestClient, key: str, job_id: str) -> dict[str, Any]:
    response = client.get(f"/admin/jobs/{job_id}", headers=bearer(key))
    assert response.status_code == 200, response.text
    return dict(response.json())


def search(client: TestClient, token: str, query: str) -> set[str]:
    response = client.post("/search", json={"query": query}, headers=bearer(token))
    assert response.status_code == 200, response.text
    return {r["doc_id"] for r in response.json()["results"]}


def test_a_queued_batch_is_written_by_the_writer_and_searchable(
    pushed: tuple[TestClient, IngestWorker, str], make_token: TokenFactory
) -> None:
    client, writer, key = pushed
    response = post(client, key, [doc("pelican-a"), doc("pelican-b")])
    assert response.status_code == 202, response.text
    queued = response.json()
    assert response.headers["location"] == f"/admin/jobs/{queued['job_id']}"
    assert queued["status"] == "queued" and queued["documents"] == 2
    assert "pelican-a" not in search(client, make_token(**ALICE), "pelican quota")

    assert (queued["documents_done"], queued["chunks_done"], queued["chunks_planned"]) == (
        0,
        0,
        None,
    )
    assert writer.run_once() == 1
    done = job(client, key, queued["job_id"])
    assert done["status"] == "succeeded" and done["chunks"] == 2 and done["errors"] == []
    assert (done["documents_done"], done["chunks_done"], done["chunks_planned"]) == (2, 2, 2)
    assert done["index_generation"] == 2 and done["finished_at"] is not None
    assert {"pelican-a", "pelican-b"} <= search(client, make_token(**ALICE), "pelican quota")

    again = post(client, key, [doc("pelican-a")])  # the same version, unchanged
    writer.run_once()
    same = job(client, key, again.json()["job_id"])
    assert same["status"] == "succeeded" and same["unchanged"] == 1 and same["chunks"] == 0
    assert same["index_generation"] == 2  # no generation spent on it


def test_a_backlog_is_written_as_one_generation(
    pushed: tuple[TestClient, IngestWorker, str],
) -> None:
    client, writer, key = pushed
    ids = [post(client, key, [doc(f"burst-{n}")]).json()["job_id"] for n in range(4)]
    ids.append(
        post(client, key, [doc("burst-0", text="The pelican quota is now 9.")]).json()["job_id"]
    )
    assert writer.run_once() == 5  # all queued jobs in one claim
    jobs = [job(client, key, i) for i in ids]
    assert {j["status"] for j in jobs} == {"succeeded"}
    assert {j["index_generation"] for j in jobs} == {2}
    assert jobs[0]["chunks"] == 0 and jobs[4]["chunks"] == 1  # the later copy of burst-0 won
    row = writer.catalog.document("acme", "burst-0", "1")
    assert row is not None and "now 9" in row.text


def test_a_full_queue_is_429_with_retry_after_and_queues_nothing(
    pushed: tuple[TestClient, IngestWorker, str],
) -> None:
    client, writer, key = pushed
    for n in range(5):
        assert post(client, key, [doc(f"q-{n}")]).status_code == 202
    refused = post(client, key, [doc("q-5")])
    assert refused.status_code == 429
    assert refused.json()["code"] == "ingest_backlog"
    assert int(refused.headers["retry-after"]) >= 1
    assert writer.catalog.jobs.counts() == {"queued": 5}
    writer.run_once()
    assert post(client, key, [doc("q-5")]).status_code == 202  # room again


def test_every_problem_of_a_batch_is_listed_and_nothing_is_queued(
    pushed: tuple[TestClient, IngestWorker, str],
) -> None:
    client, writer, key = pushed
    documents = [
        doc("fine"),
        doc("no-acl", acl=[]),
        doc("bad-dates", effective_from="2024-05-01", effective_to="2024-01-01"),
        {**doc("extra"), "colour": "red"},
        doc("bad version", version="1:2"),
        doc("fine"),  # the same version twice
        {k: v for k, v in doc("no-region").items() if k != "region"},
    ]
    response = post(client, key, documents)
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    problems = {(e["index"], e["doc_id"], e["field"]) for e in response.json()["errors"]}
    assert problems == {
        (1, "no-acl", "acl"),
        (2, "bad-dates", "effective_to"),
        (3, "extra", "colour"),
        (4, "bad version", "version"),
        (5, "fine", "version"),
        (6, "no-region", "region"),
    }
    assert "pelican" not in response.text  # fields and identifiers, never the text
    assert writer.catalog.jobs.counts() == {}


@pytest.mark.parametrize(
    "body",
    [b"not json", b'{"documents": []}', b'{"documents": "x"}', b"{}", b'{"docs": [1]}'],
)
def test_a_malformed_batch_is_422(
    pushed: tuple[TestClient, IngestWorker, str], body: bytes
) -> None:
    client, writer, key = pushed
    headers = {**bearer(key), "Content-Type": "application/json"}
    response = client.post("/admin/documents", content=body, headers=headers)
    assert response.status_code == 422 and response.json()["errors"], response.text
    assert writer.catalog.jobs.counts() == {}


def test_a_batch_past_its_bounds_is_one_small_refusal(
    pushed: tuple[TestClient, IngestWorker, str],
) -> None:
    """Every empty document has several problems; listed all, a body of empty objects
    made a refusal a hundred times its size, in memory first."""
    client, writer, key = pushed
    headers = {**bearer(key), "Content-Type": "application/json"}
    many = json.dumps({"documents": [{}] * 50_000}).encode()
    response = client.post("/admin/documents", content=many, headers=headers)
    assert response.status_code == 422
    assert response.json()["errors"] == [
        {
            "index": None,
            "doc_id": None,
            "field": "documents",
            "message": "50000 documents; a batch holds at most 1000",
        }
    ]
    thousand = json.dumps({"documents": [{}] * 1000}).encode()
    response = client.post("/admin/documents", content=thousand, headers=headers)
    assert response.status_code == 422 and len(response.json()["errors"]) == 100
    assert "(the first 100 listed)" in response.json()["detail"]
    assert len(response.content) < 20_000
    assert writer.catalog.jobs.counts() == {}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "JSON nested too deeply"),
        (b'{"documents": [{"doc_id": "a", "acl": ["group:x"], "acl": []}]}', "duplicate key"),
    ],
)
def test_json_a_parser_would_read_wrongly_is_422(
    pushed: tuple[TestClient, IngestWorker, str], body: bytes, message: str
) -> None:
    client, writer, key = pushed
    headers = {**bearer(key), "Content-Type": "application/json"}
    response = client.post("/admin/documents", content=body, headers=headers)
    assert response.status_code == 422, response.text
    assert response.json()["errors"][0]["message"].startswith(message)
    assert writer.catalog.jobs.counts() == {}


def test_a_document_of_another_tenant_is_403_and_nothing_is_queued(
    pushed: tuple[TestClient, IngestWorker, str],
) -> None:
    client, writer, key = pushed
    response = post(client, key, [doc("mine", tenant="acme"), doc("theirs", tenant="globex")])
    assert response.status_code == 403 and response.json()["code"] == "tenant_mismatch"
    assert writer.catalog.jobs.counts() == {}


def test_who_may_push_and_read_jobs(
    pushed: tuple[TestClient, IngestWorker, str], make_token: TokenFactory
) -> None:
    client, writer, key = pushed
    catalog = writer.catalog
    search_key, _ = create_key(catalog, tenant="acme", region="EU", principals=["group:staff"])
    globex, _ = create_key(catalog, tenant="globex", region="EU", principals=[], scope="ingest")
    assert post(client, search_key, [doc("x")]).status_code == 403
    assert post(client, make_token(**ALICE), [doc("x")]).status_code == 403  # not an admin
    by_admin = post(client, make_token(**ROOT), [doc("x")])
    assert by_admin.status_code == 202
    job_id = by_admin.json()["job_id"]
    assert job(client, key, job_id)["status"] == "queued"  # the tenant's key sees it
    other = client.get(f"/admin/jobs/{job_id}", headers=bearer(globex))
    assert other.status_code == 404  # another tenant's job is as if missing
    assert client.get("/admin/jobs/nope", headers=bearer(key)).status_code == 404
    assert client.post("/search", json={"query": "x"}, headers=bearer(key)).status_code == 403


def test_acl_changes_and_deletes_apply_to_queued_jobs_too(
    pushed: tuple[TestClient, IngestWorker, str], make_token: TokenFactory
) -> None:
    """A change sent after a batch is never undone by the batch being written later."""
    client, writer, key = pushed
    post(client, key, [doc("pending-acl"), doc("pending-gone")])
    changed = client.put(
        "/admin/documents/pending-acl/acl", json={"acl": ["group:board"]}, headers=bearer(key)
    )
    assert changed.status_code == 200 and changed.json()["versions"] == 1
    gone = client.delete("/admin/documents/pending-gone", headers=bearer(key))
    assert gone.status_code == 200 and gone.json()["versions"] == 1
    writer.run_once()
    row = writer.catalog.document("acme", "pending-acl", "1")
    assert row is not None and row.visibility.acl == ("group:board",)
    assert writer.catalog.document("acme", "pending-gone", "1") is None
    assert "pending-acl" not in search(client, make_token(**ALICE), "pelican quota")


def test_a_version_as_long_as_a_push_allows_can_be_changed_and_deleted_by_version(
    pushed: tuple[TestClient, IngestWorker, str],
) -> None:
    """A push takes versions of up to 512 characters; the ACL route and `?version=` took
    200, so such a version could be pushed but never narrowed or deleted by version."""
    client, writer, key = pushed
    long = "v" * 512
    post(client, key, [doc("long-version", version=long), doc("long-gone", version=long)])
    writer.run_once()
    change = {"acl": ["group:board"], "version": long}
    changed = client.put("/admin/documents/long-version/acl", json=change, headers=bearer(key))
    assert changed.status_code == 200 and changed.json()["versions"] == 1, changed.text
    gone = client.delete(
        "/admin/documents/long-gone", params={"version": long}, headers=bearer(key)
    )
    assert gone.status_code == 200 and gone.json()["versions"] == 1, gone.text
    writer.run_once()
    row = writer.catalog.document("acme", "long-version", long)
    assert row is not None and row.visibility.acl == ("group:board",)
    assert writer.catalog.document("acme", "long-gone", long) is None
    # A version no write stored names nothing, however long: 404, as a doc_id in a path
    # (past ingest's 1,024 bytes none can be; tests/test_identifier_bounds.py).
    for unknown in (long + "v", "v" * 1025):
        change = {"acl": ["group:board"], "version": unknown}
        refused = client.put("/admin/documents/long-version/acl", json=change, headers=bearer(key))
        assert refused.status_code == 404, refused.text


class ChangesWhileEmbedding(Embedder):
    """The model, with an ACL change arriving while a batch is being embedded."""

    def __init__(self, model: Embedder, change: Any) -> None:
        self.__dict__.update(model.__dict__)
        self._change = change

    def embed_with_spans(self, *args: Any, **kwargs: Any) -> Any:
        self._change()
        return super().embed_with_spans(*args, **kwargs)


def test_an_acl_change_during_embedding_is_the_acl_written(
    pushed: tuple[TestClient, IngestWorker, str], embedder: Embedder, make_token: TokenFactory
) -> None:
    client, writer, key = pushed
    post(client, key, [doc("racing")])

    def revoke() -> None:
        response = client.put(
            "/admin/documents/racing/acl", json={"acl": ["group:board"]}, headers=bearer(key)
        )
        assert response.status_code == 200

    writer.embedder = ChangesWhileEmbedding(embedder, revoke)
    writer.run_once()
    row = writer.catalog.document("acme", "racing", "1")
    assert row is not None and row.visibility.acl == ("group:board",)
    assert "racing" not in search(client, make_token(**ALICE), "pelican quota racing")


class AwayAtFirst(Embedder):
    """The model, behind a catalog that is away for the first `times` batches."""

    def __init__(self, model: Embedder, times: int) -> None:
        self.__dict__.update(model.__dict__)
        self.left = times

    def embed_with_spans(self, *args: Any, **kwargs: Any) -> Any:
        if self.left > 0:
            self.left -= 1
            raise GatewayError("catalog_unavailable", "the catalog database is away")
        return super().embed_with_spans(*args, **kwargs)


@pytest.mark.sleeps  # a second's wait after each outage
def test_outages_while_a_job_runs_never_fail_it(
    pushed: tuple[TestClient, IngestWorker, str], embedder: Embedder
) -> None:
    """A writer that stops three times fails the job (above); a writer that runs on
    through three outages of the catalog does not: no fault of the job."""
    client, writer, key = pushed
    queued = post(client, key, [doc("patient")]).json()["job_id"]
    writer.embedder = AwayAtFirst(embedder, 4)
    writer.run(lambda: job(client, key, queued)["status"] in ("succeeded", "failed"))
    ended = job(client, key, queued)
    assert ended["status"] == "succeeded", ended
    assert writer.embedder.left == 0


def test_a_job_that_keeps_stopping_its_writer_fails_with_the_reason(tmp_path: Path) -> None:
    jobs = DataLayout(tmp_path / "data").open_catalog().jobs
    queued = jobs.submit("acme", "test", [{"doc_id": "x"}], 10)
    for _ in (1, 2):
        assert [j.job_id for j in jobs.claim(100)] == [queued.job_id]
        assert jobs.resume_interrupted() == (1, 0)  # the writer stopped: queued again
    jobs.claim(100)
    assert jobs.resume_interrupted() == (0, 1)
    failed = jobs.job("acme", queued.job_id)
    assert failed is not None and failed.status == "failed" and failed.attempts == 3
    assert "stopped 3 times" in failed.errors[0]["message"]
    assert failed.records == []  # the documents are not kept once the job has ended


def test_a_writer_that_lost_its_lease_cannot_end_a_job_another_ended(tmp_path: Path) -> None:
    """A writer whose lease dropped mid-claim (its PostgreSQL session ended) may still be
    running; the writer that took over requeued the job and finished it. The first one's
    late failure marked the succeeded job failed, its records gone: ending a job now
    takes it running."""
    catalog = DataLayout(tmp_path / "data").open_catalog()
    jobs = catalog.jobs
    queued = jobs.submit("acme", "test", [{"doc_id": "x"}], 10)
    assert [j.job_id for j in jobs.claim(100)] == [queued.job_id]  # the first writer's
    assert jobs.resume_interrupted() == (1, 0)  # the writer taking over
    assert [j.job_id for j in jobs.claim(100)] == [queued.job_id]
    jobs.finish_unchanged([JobResult(queued.job_id, 0, 1)], 1)
    jobs.fail([queued.job_id], [job_error("the first writer's late failure")])
    ended = jobs.job("acme", queued.job_id)
    assert ended is not None and ended.status == "succeeded" and ended.errors == []
    assert jobs.claim(100) == []  # nor is an ended job claimed again


def test_a_writer_that_lost_its_lease_cannot_end_the_claim_another_holds(
    tmp_path: Path,
) -> None:
    """The same, while the writer that took over still holds its own claim of the job:
    the first writer's late failure failed it, its records gone, and the second writer's
    finish then found nothing running. A job is ended only in the claim that ends it."""
    jobs = DataLayout(tmp_path / "data").open_catalog().jobs
    queued = jobs.submit("acme", "test", [{"doc_id": "x"}], 10)
    [first] = jobs.claim(100)
    assert jobs.resume_interrupted() == (1, 0)
    [second] = jobs.claim(100)
    late = [job_error("the first writer's late failure")]
    jobs.fail([queued.job_id], late, claimed={first.job_id: first.started_at})
    jobs.finish_unchanged(
        [JobResult(queued.job_id, 0, 1)], 1, claimed={second.job_id: second.started_at}
    )
    ended = jobs.job("acme", queued.job_id)
    assert ended is not None and ended.status == "succeeded" and ended.errors == []


def test_concurrent_batches_never_overshoot_the_queue_bound(tmp_path: Path) -> None:
    jobs = DataLayout(tmp_path / "data").open_catalog().jobs
    outcomes: list[str] = []

    def submit() -> None:
        try:
            jobs.submit("acme", "test", [{"doc_id": "x"}], 5)
            outcomes.append("queued")
        except GatewayError as refused:
            outcomes.append(refused.code)

    threads = [threading.Thread(target=submit) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count("queued") == 5 and outcomes.count("ingest_backlog") == 15
    assert jobs.counts() == {"queued": 5}


class AwayOnce(Embedder):
    """The model, embedding while the catalog's database is away the first time."""

    def __init__(self, model: Embedder) -> None:
        self.__dict__.update(model.__dict__)
        self.calls = 0

    def embed_with_spans(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise GatewayError("catalog_unavailable", "the database went away")
        return super().embed_with_spans(*args, **kwargs)


def test_a_service_away_mid_job_fails_no_job_it_is_written_once_back(
    pushed: tuple[TestClient, IngestWorker, str], embedder: Embedder
) -> None:
    client, writer, key = pushed
    job_id = post(client, key, [doc("survivor")]).json()["job_id"]
    writer.embedder = AwayOnce(embedder)

    def done() -> bool:
        return job(client, key, job_id)["status"] not in ("queued", "running")

    writer.run(done)
    ended = job(client, key, job_id)
    assert ended["status"] == "succeeded" and ended["errors"] == []
    row = writer.catalog.jobs.job("acme", job_id)
    assert row is not None and row.attempts == 1  # the outage's attempt given back


def test_a_change_whose_generation_fails_changes_no_queued_copy(
    tmp_path: Path, embedder: Embedder, jwks_file: Path, make_token: TokenFactory
) -> None:
    """An ACL change or a delete also applies to the copies of the document in queued jobs.
    Those were changed, and committed, before the change's own generation was written: when
    that failed (here a file stands where the next Tantivy generation goes, as a full disk
    would fail it), the caller got an error, yet the queued copy later landed with the ACL
    it was told was not set, and the queued version it was told was not deleted was gone.
    Now the queued copies change in the generation's own transaction: all or nothing."""
    with push_app(tmp_path, embedder, jwks_file, raise_server_exceptions=False) as app:
        client, writer, key = app
        assert post(client, key, [doc("widened"), doc("doomed")]).status_code == 202
        writer.run_once()
        again = [doc("widened", text="The pelican quota is PQ-9."), doc("doomed", version="2")]
        queued = post(client, key, again).json()["job_id"]
        current = writer.catalog.current_generation_id()
        assert current is not None
        in_the_way = writer.layout.lexical(current + 1)
        in_the_way.parent.mkdir(parents=True, exist_ok=True)
        in_the_way.write_text("not a generation")

        widen = {"acl": ["group:everyone"]}
        changed = client.put("/admin/documents/widened/acl", json=widen, headers=bearer(key))
        assert changed.status_code == 500, changed.text
        deleted = client.delete("/admin/documents/doomed", headers=bearer(key))
        assert deleted.status_code == 500, deleted.text

        in_the_way.unlink()
        writer.run_once()
        assert job(client, key, queued)["status"] == "succeeded"
        widened = writer.catalog.document("acme", "widened", "1")
        assert widened is not None and "PQ-9" in widened.text
        assert widened.visibility.acl == ("group:staff",)  # as sent: the change failed
        assert writer.catalog.document("acme", "doomed", "2") is not None  # as sent, too
        assert writer.catalog.document("acme", "doomed", "1") is not None

        # Once the change goes through, it applies to every copy, queued ones included.
        post(client, key, [doc("widened", text="The pelican quota is PQ-10.")])
        changed = client.put("/admin/documents/widened/acl", json=widen, headers=bearer(key))
        assert changed.status_code == 200, changed.text
        writer.run_once()
        widened = writer.catalog.document("acme", "widened", "1")
        assert widened is not None and "PQ-10" in widened.text
        assert widened.visibility.acl == ("group:everyone",)
