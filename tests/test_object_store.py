"""The index on S3-compatible object storage (SeaweedFS on loopback) with the catalog on
PostgreSQL: the writer publishes each Tantivy generation and keeps the LanceDB table in
the bucket; a replica with a data dir of its own copies generations to its disk, serves
the writer's changes from its next request, and old generations leave the bucket."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import psycopg
import pyarrow.fs as pafs
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from gateway.api.app import create_app
from gateway.bench.server import free_port, gateway_command
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.ingest.erasure import erase
from gateway.ingest.pipeline import delete_versions, ingest_paths, set_acl
from gateway.ingest.records import record_of
from gateway.ingest.sources import load_documents
from gateway.restriction import Restriction
from gateway.settings import Settings
from gateway.storage.layout import KEEP_GENERATIONS, DataLayout, ServedIndex, open_served
from gateway.storage.vectors import VectorStore, store_outage_is_not_ready
from tests.helpers.callers import ALICE
from tests.helpers.documents import TODAY, big_batch, write_corpus, write_doc
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.postgres import Cluster
from tests.helpers.processes import Reap, gateway_env
from tests.helpers.seaweed import S3Store, throwaway_store


def settings_for(root: Path, url: str, s3: S3Store, prefix: str, jwks: Path) -> Settings:
    return make_settings(root, jwks).model_copy(
        update={
            "database_url": url,
            "index_uri": prefix,
            "aws_endpoint_url": s3.endpoint,
            "aws_access_key_id": "gateway-test",
            "aws_secret_access_key": SecretStr("gateway-test-secret"),
            "aws_allow_http": True,
        }
    )


def bucket_files(s3: S3Store, prefix: str, under: str) -> list[str]:
    """Every object's path under `prefix/under/`, relative to it."""
    fs = pafs.S3FileSystem(
        access_key="gateway-test",
        secret_key="gateway-test-secret",
        endpoint_override=s3.endpoint.removeprefix("http://"),
        scheme="http",
        region="us-east-1",
    )
    root = f"{prefix.removeprefix('s3://')}/{under}/"
    listing = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    return [i.path[len(root) :] for i in listing if i.type == pafs.FileType.File]


def published(s3: S3Store, prefix: str) -> list[str]:
    """The lexical generations in the bucket."""
    return sorted({path.split("/")[0] for path in bucket_files(s3, prefix, "lexical")})


def lance_versions(s3: S3Store, prefix: str) -> int:
    """How many versions the bucket's LanceDB tables have written (one manifest each)."""
    return sum("/_versions/" in path for path in bucket_files(s3, prefix, "vectors"))


def test_a_replica_serves_what_the_writer_publishes(
    postgres: Cluster,
    s3: S3Store,
    tmp_path: Path,
    embedder: Embedder,
    jwks_file: Path,
    make_token: TokenFactory,
) -> None:
    url, prefix = postgres.new_database(), s3.new_prefix()
    writer = DataLayout.configured(settings_for(tmp_path / "writer", url, s3, prefix, jwks_file))
    ingest_paths([write_corpus(tmp_path / "corpus")], writer, embedder)
    assert not (writer.root / "vectors").exists()  # the table is in the bucket
    assert published(s3, prefix) == ["g000001"]

    replica = settings_for(tmp_path / "replica", url, s3, prefix, jwks_file)
    alice = bearer(make_token(**ALICE))
    with TestClient(create_app(replica, embedder=embedder)) as client:

        def found(query: str) -> set[str]:
            response = client.post("/search", json={"query": query}, headers=alice)
            assert response.status_code == 200, response.text
            return {r["doc_id"] for r in response.json()["results"]}

        assert "refund-policy" in found("refunds paid RPL-14")
        assert (tmp_path / "replica" / "lexical" / "g000001").is_dir()  # its own copy
        for n, acl in enumerate((["group:board"], ["group:staff"], ["group:board"]), 2):
            set_acl(writer, "acme", "refund-policy", acl)  # a generation each
            # The replica's watcher finds it (the routes that change documents also wait
            # for every replica: tests/test_replicas.py).
            deadline = time.monotonic() + 5
            while client.get("/readyz").json()["index_generation"] != n:
                assert time.monotonic() < deadline, f"generation {n} not served in 5 s"
                time.sleep(0.05)
            assert ("refund-policy" in found("refunds paid RPL-14")) == (acl == ["group:staff"])
        # The bucket keeps the last few generations (and any a replica still serves); so
        # does the replica's disk.
        kept = [f"g{n:06d}" for n in range(5 - KEEP_GENERATIONS, 5)]
        assert published(s3, prefix) == kept
        assert sorted(p.name for p in (tmp_path / "replica" / "lexical").iterdir()) == kept


def test_a_generation_left_without_documents_is_served_by_every_replica(
    postgres: Cluster, s3: S3Store, tmp_path: Path, embedder: Embedder, jwks_file: Path
) -> None:
    """The last document deleted and erased, the erasure's generation has no file at all:
    nothing was published, and every replica but the writer waited for files that would
    never come (503 to every request, the erasure waiting on them) until the next ingest."""
    url, prefix = postgres.new_database(), s3.new_prefix()
    writer = DataLayout.configured(settings_for(tmp_path / "writer", url, s3, prefix, jwks_file))
    meta = {"doc_id": "only", "tenant": "acme", "region": "EU", "acl": ["group:staff"]}
    docs = write_doc(tmp_path / "docs", "x.md", {**meta, "effective_from": "2020-01-01"}, "Zebra.")
    ingest_paths([docs.parent], writer, embedder)
    delete_versions(writer, "acme", "only")
    erased = erase(writer, ann_min_rows=10**9)
    replica = DataLayout.configured(settings_for(tmp_path / "replica", url, s3, prefix, jwks_file))
    served = open_served(replica, replica.open_catalog(), embedder.name, embedder.dim)
    assert served is not None and served.number == erased.generation
    everyone = Restriction("acme", frozenset({"group:staff"}), frozenset({"EU"}), TODAY)
    assert served.lexical.search(everyone, "zebra", 10) == []


def test_a_replica_whose_store_goes_away_serves_its_local_copy_and_says_so(
    postgres: Cluster, tmp_path: Path, embedder: Embedder, jwks_file: Path, make_token: TokenFactory
) -> None:
    with throwaway_store() as store:  # its own: this test stops it
        url, prefix = postgres.new_database(), store.new_prefix()
        writer = DataLayout.configured(settings_for(tmp_path / "w", url, store, prefix, jwks_file))
        ingest_paths([write_corpus(tmp_path / "corpus")], writer, embedder)
        replica = settings_for(tmp_path / "replica", url, store, prefix, jwks_file)
        alice = bearer(make_token(**ALICE))
        with TestClient(create_app(replica, embedder=embedder)) as client:
            assert client.get("/readyz").json()["index_store"] == "reachable"
            store.stop()
            deadline = time.monotonic() + 10  # the replica looks every 5 s
            while client.get("/readyz").json().get("index_store") != "unreachable":
                assert time.monotonic() < deadline, "the replica did not notice"
                time.sleep(0.2)
            assert client.get("/readyz").status_code == 200  # nothing newer to miss
            response = client.post("/search", json={"query": "refunds RPL-14"}, headers=alice)
            assert response.status_code == 200
            assert "refund-policy" in {r["doc_id"] for r in response.json()["results"]}


@pytest.mark.server
@pytest.mark.long
@pytest.mark.parametrize("moment", ["while writing", "between publishing and committing"])
def test_a_writer_killed_mid_generation_leaves_no_half_generation(
    postgres: Cluster,
    s3: S3Store,
    tmp_path: Path,
    embedder: Embedder,
    jwks_file: Path,
    moment: str,
    reap: Reap,
) -> None:
    url, prefix = postgres.new_database(), s3.new_prefix()
    seeded = DataLayout.configured(settings_for(tmp_path / "seed", url, s3, prefix, jwks_file))
    ingest_paths([write_corpus(tmp_path / "corpus")], seeded, embedder)
    catalog = seeded.open_catalog()
    documents = load_documents([big_batch(tmp_path / "bulk.jsonl", 240, short=True)])
    job = catalog.jobs.submit("acme", "test", [record_of(d) for d in documents], 10)
    before = len(catalog.all_documents())
    env = gateway_env(
        GATEWAY_DATA_DIR=str(tmp_path / "writer"),
        GATEWAY_DATABASE_URL=url,
        GATEWAY_INDEX_URI=prefix,
        **s3.env(),
    )

    def start() -> subprocess.Popen[bytes]:
        command = [gateway_command(), "worker"]
        return reap(
            subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )

    versions = lance_versions(s3, prefix)
    writer = start()
    deadline = time.monotonic() + 120
    while not (tmp_path / "writer" / "lexical" / "g000002").exists():
        assert time.monotonic() < deadline and writer.poll() is None, "the writer never wrote"
        time.sleep(0.005)
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=False) as holder:
        if moment == "between publishing and committing":
            # The commit marks the job done in its transaction: holding the job's row
            # keeps the writer there, after it has published generation 2.
            holder.execute("SELECT 1 FROM jobs WHERE job_id = %s FOR UPDATE", (job.job_id,))
            while "g000002" not in published(s3, prefix) or lance_versions(s3, prefix) == versions:
                # published generation 2, and written the LanceDB table's next version
                assert time.monotonic() < deadline and writer.poll() is None, "never published"
                time.sleep(0.05)
        assert writer.poll() is None, "the writer committed before it could be killed"
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        holder.rollback()
    if moment == "between publishing and committing":
        assert "g000002" in published(s3, prefix)  # whole in the bucket, named by no commit

    def served_by_a_new_replica(name: str) -> ServedIndex:
        replica = DataLayout.configured(settings_for(tmp_path / name, url, s3, prefix, jwks_file))
        index = open_served(replica, replica.open_catalog(), embedder.name, embedder.dim)
        assert index is not None
        return index

    staff = Restriction("acme", frozenset({"group:staff"}), frozenset({"EU"}), TODAY)
    first = served_by_a_new_replica("replica-1")
    assert first.number == 1 and len(catalog.all_documents()) == before
    assert first.lexical.filter_only(staff) == first.vectors.filter_only(staff)
    if moment == "between publishing and committing":
        # The lease moves: another host's writer commits a generation 2 of its own, which
        # revokes a document from staff. The killed writer's host must serve that one,
        # never its own build of a generation 2 that no commit named (it served that
        # one, the revoked document in its BM25 lane and a document never committed).
        set_acl(seeded, "acme", "refund-policy", ["group:board"])
        host = DataLayout.configured(settings_for(tmp_path / "writer", url, s3, prefix, jwks_file))
        theirs = open_served(host, host.open_catalog(), embedder.name, embedder.dim)
        assert theirs is not None and theirs.number == 2
        shown = theirs.lexical.filter_only(staff)
        assert shown == theirs.vectors.filter_only(staff)
        assert not any(c.startswith(("refund-policy@", "bulk-")) for c in shown)
    writer = start()  # resumes the job: all of it, or nothing
    try:
        while (row := catalog.jobs.job("acme", job.job_id)) and row.status != "succeeded":
            assert row.status in ("queued", "running") and time.monotonic() < deadline + 180
            time.sleep(0.1)
    finally:
        writer.terminate()
        writer.wait(timeout=60)
    second = served_by_a_new_replica("replica-2")
    ended = 3 if moment == "between publishing and committing" else 2
    assert second.number == ended and len(catalog.all_documents()) == before + 240
    chunks = second.lexical.filter_only(staff)
    assert chunks == second.vectors.filter_only(staff)
    assert {c.split("@")[0] for c in chunks} >= {f"bulk-{n}" for n in range(240)}


def test_lancedb_that_cannot_reach_the_store_is_not_ready_not_a_job_fault() -> None:
    """LanceDB reports an unreachable store as a ValueError: the writer failed the job as
    its own fault (its documents dropped) and a replica answered 500. It is the transient
    503 `not_ready` now, as pyarrow's errors for the Tantivy files are."""
    dead = f"http://127.0.0.1:{free_port()}"
    options = {
        "aws_region": "us-east-1",
        "aws_endpoint": dead,
        "aws_access_key_id": "gateway-test",
        "aws_secret_access_key": "gateway-test-secret",
        "allow_http": "true",
        "client_max_retries": "0",
    }
    store = VectorStore("s3://gateway/nowhere/vectors", 384, version=1, options=options)
    with pytest.raises(GatewayError) as away, store_outage_is_not_ready():
        store.snapshot()
    assert away.value.code == "not_ready" and away.value.transient
    assert dead.removeprefix("http://") not in away.value.detail  # no endpoint, no key
