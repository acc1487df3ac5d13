"""The generation lock on PostgreSQL is an advisory lock of one session, and a session can
be cut while its writer builds a generation (an idle_session_timeout, a NAT dropping an
idle connection, pg_terminate_backend). Another writer then takes the lock and builds the
same generation number from the same base. The writer that lost it must neither publish
over that generation's files nor commit its own: before, it committed generation 2 while
the bucket held the other writer's Tantivy build of it, and every replica served a mix
(a document revoked from staff came back to them through BM25).

Real PostgreSQL and SeaweedFS, real `gateway acl set` processes on data dirs of their own
(hosts); row locks taken by the test hold each writer at a chosen step, so that the order
is the same on every run. Without an object store, writers on several hosts share one data
dir: there too, the writer that lost the lock must not touch the other's generation (it
builds in a directory of its own, and puts it in place only after the same check)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway.bench.server import gateway_command
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.ingest import writer
from gateway.ingest.pipeline import ingest_paths, set_acl
from gateway.restriction import Restriction
from gateway.storage import partitions
from gateway.storage.catalog import GenerationRow
from gateway.storage.layout import DataLayout, open_served, prune_lexical, snapshot_lexical
from gateway.storage.lexical import TantivyIndex
from gateway.storage.partitions import LexicalIndex
from gateway.storage.vectors import VectorStore
from tests.helpers.documents import TODAY, write_corpus
from tests.helpers.postgres import Cluster
from tests.helpers.processes import Reap, gateway_env
from tests.helpers.seaweed import S3Store
from tests.test_object_store import published, settings_for

GENERATION_KEY = 0x6761_6767  # gateway.storage.lease._GENERATION_KEY
STAFF = Restriction("acme", frozenset({"group:staff"}), frozenset({"EU"}), TODAY)


def cut_generation_lock(pg: str) -> int:
    """Terminate the session that holds the generation lock; how many were."""
    with psycopg.connect(pg, autocommit=True) as connection:
        return len(
            connection.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
                "AND objid = %s AND granted",
                (GENERATION_KEY,),
            ).fetchall()
        )


def someone_waits_on(pg: str, holder: psycopg.Connection) -> bool:
    """Whether a session is blocked by a lock `holder` holds."""
    with psycopg.connect(pg, autocommit=True) as connection:
        query = "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
        found = connection.execute(query, (holder.info.backend_pid,)).fetchone()
    return found is not None and found[0] > 0


def staff_lanes(layout: DataLayout, embedder: Embedder) -> tuple[int, set[str], set[str]]:
    """What a new replica serves: its generation, and the chunks staff may see in each
    lane (BM25 from the bucket's Tantivy files, dense from the LanceDB version)."""
    served = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim)
    assert served is not None
    return served.number, served.lexical.filter_only(STAFF), served.vectors.filter_only(STAFF)


def acl_of(layout: DataLayout, doc_id: str) -> str:
    return next(d.acl_json for d in layout.open_catalog().all_documents() if d.doc_id == doc_id)


@pytest.mark.server
def test_a_writer_that_lost_the_lock_commits_nothing_and_replicas_serve_one_build(
    postgres: Cluster, s3: S3Store, tmp_path: Path, embedder: Embedder, jwks_file: Path, reap: Reap
) -> None:
    url, prefix = postgres.new_database(), s3.new_prefix()
    pg = url.replace("+psycopg", "")
    seed = DataLayout.configured(settings_for(tmp_path / "seed", url, s3, prefix, jwks_file))
    ingest_paths([write_corpus(tmp_path / "corpus")], seed, embedder)
    env = gateway_env(GATEWAY_DATABASE_URL=url, GATEWAY_INDEX_URI=prefix, **s3.env())

    def acl_set(host: str, doc_id: str) -> subprocess.Popen[bytes]:
        command = [gateway_command(), "acl", "set", doc_id, "--acl", "group:board"]
        return reap(
            subprocess.Popen(
                [*command, "--tenant", "acme"],
                env={**env, "GATEWAY_DATA_DIR": str(tmp_path / host)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )

    def wait_until_held(process: subprocess.Popen[bytes], holder: psycopg.Connection) -> None:
        while not someone_waits_on(pg, holder):
            assert time.monotonic() < deadline and process.poll() is None, "never got there"
            time.sleep(0.05)

    # Each writer revokes a document from staff; the row lock on it holds the writer in
    # the transaction that commits its generation 2, after it published it.
    hold_a, hold_b = psycopg.connect(pg), psycopg.connect(pg)
    hold_a.execute("SELECT 1 FROM documents WHERE doc_id = 'refund-policy' FOR UPDATE")
    hold_b.execute("SELECT 1 FROM documents WHERE doc_id = 'filler-0' FOR UPDATE")
    deadline = time.monotonic() + 180
    a = acl_set("host-a", "refund-policy")
    wait_until_held(a, hold_a)
    assert "g000002" in published(s3, prefix)
    assert cut_generation_lock(pg) == 1  # host A's session: the lock is free for B
    b = acl_set("host-b", "filler-0")  # publishes its own generation 2 over A's
    wait_until_held(b, hold_b)
    hold_a.rollback()
    out_a = a.communicate(timeout=120)[0].decode()
    hold_b.rollback()
    out_b = b.communicate(timeout=120)[0].decode()
    hold_a.close()
    hold_b.close()

    replica = DataLayout.configured(settings_for(tmp_path / "replica", url, s3, prefix, jwks_file))
    number, bm25, dense = staff_lanes(replica, embedder)
    assert number == 2
    assert bm25 == dense, "a replica serves a mix of two builds of generation 2"
    # B's change is served, in both lanes; A's was not committed (it is to be retried).
    assert "filler-0@1:0" not in bm25 and "refund-policy@2:0" in bm25
    assert acl_of(seed, "filler-0") == '["group:board"]'
    assert acl_of(seed, "refund-policy") == '["group:staff"]'
    # A says why it failed and that nothing of its change was committed; B succeeded.
    assert a.returncode == 1, out_a
    assert "generation lock was lost" in out_a and "nothing of this write was committed" in out_a
    assert b.returncode == 0, out_b


@pytest.mark.server
def test_a_writer_whose_lock_was_cut_while_building_never_publishes_over_a_commit(
    postgres: Cluster, s3: S3Store, tmp_path: Path, embedder: Embedder, jwks_file: Path
) -> None:
    """The lock's session cut while the writer builds (idle, long before its commit), and
    another host's writer commits generation 2 meanwhile: the first must not publish its
    own generation 2 over the committed one's files."""
    url, prefix = postgres.new_database(), s3.new_prefix()
    pg = url.replace("+psycopg", "")
    seed = DataLayout.configured(settings_for(tmp_path / "seed", url, s3, prefix, jwks_file))
    ingest_paths([write_corpus(tmp_path / "corpus")], seed, embedder)
    host_b = DataLayout.configured(settings_for(tmp_path / "host-b", url, s3, prefix, jwks_file))

    class HostA(DataLayout):
        def local_lexical(self, generation: GenerationRow) -> Path:
            # Host A has planned its change on generation 1, under the lock: its session
            # is cut, and host B revokes filler-0 from staff as generation 2.
            if generation.id == 1 and not (tmp_path / "cut").exists():
                (tmp_path / "cut").touch()
                assert cut_generation_lock(pg) == 1
                set_acl(host_b, "acme", "filler-0", ["group:board"])
            return super().local_lexical(generation)

    host_a = HostA(tmp_path / "host-a", url, seed.store)
    with pytest.raises(Exception) as failed:  # noqa: PT011 (checked below, after the index)
        set_acl(host_a, "acme", "refund-policy", ["group:board"])

    replica = DataLayout.configured(settings_for(tmp_path / "replica", url, s3, prefix, jwks_file))
    number, bm25, dense = staff_lanes(replica, embedder)
    assert number == 2
    assert bm25 == dense, "host A's build was published over generation 2"
    assert "filler-0@1:0" not in bm25 and "refund-policy@2:0" in bm25
    assert acl_of(seed, "filler-0") == '["group:board"]'
    assert acl_of(seed, "refund-policy") == '["group:staff"]'
    # Transient: a worker queues the jobs again, a caller retries.
    assert isinstance(failed.value, GatewayError) and failed.value.transient
    assert "generation lock was lost" in failed.value.detail


# A generation 2 committed by a writer that does not check the lock (an older release
# during an upgrade, whose lock was cut): a copy of generation 1's row.
RIVAL_GENERATION = (
    "INSERT INTO generations (id, created_at, lexical_dir, vector_table, vector_version,"
    " model_name, dim, documents, chunks, precisions) SELECT 2, created_at, 'lexical/g000002',"
    " vector_table, vector_version, model_name, dim, 0, 0, precisions FROM generations"
    " WHERE id = 1"
)


@pytest.mark.server
@pytest.mark.parametrize("moment", ["before publishing", "before committing"])
def test_a_generation_committed_meanwhile_is_a_clear_error(
    postgres: Cluster, s3: S3Store, tmp_path: Path, embedder: Embedder, jwks_file: Path, moment: str
) -> None:
    """Before publishing, the writer does not replace its files; at the commit, the
    duplicate number is a clear error to retry, not an IntegrityError's traceback."""
    url, prefix = postgres.new_database(), s3.new_prefix()
    pg = url.replace("+psycopg", "")
    seed = DataLayout.configured(settings_for(tmp_path / "seed", url, s3, prefix, jwks_file))
    ingest_paths([write_corpus(tmp_path / "corpus")], seed, embedder)

    def rival_commits() -> None:
        with psycopg.connect(pg, autocommit=True) as connection:
            connection.execute(RIVAL_GENERATION)

    class Host(DataLayout):
        def local_lexical(self, generation: GenerationRow) -> Path:
            if moment == "before publishing":
                rival_commits()
            return super().local_lexical(generation)

        def build_vector_copy(self, number: int, table: str, store: VectorStore) -> None:
            if moment == "before committing":
                rival_commits()
            super().build_vector_copy(number, table, store)

    with pytest.raises(GatewayError) as taken:
        host = Host(tmp_path / "host", url, seed.store)
        set_acl(host, "acme", "refund-policy", ["group:board"])
    assert taken.value.transient
    assert "generation 2 was committed by another writer meanwhile" in taken.value.detail
    assert "nothing of this write was committed" in taken.value.detail
    assert acl_of(seed, "refund-policy") == '["group:staff"]'
    if moment == "before publishing":
        assert "g000002" not in published(s3, prefix)


@pytest.mark.server
def test_a_writer_whose_lock_is_cut_after_its_commit_succeeds(
    postgres: Cluster, s3: S3Store, tmp_path: Path, embedder: Embedder, jwks_file: Path, reap: Reap
) -> None:
    """The session ending between the commit and the unlock takes the lock with it: the
    change is committed, and the command says so (it said `catalog_unavailable`)."""
    url, prefix = postgres.new_database(), s3.new_prefix()
    pg = url.replace("+psycopg", "")
    seed = DataLayout.configured(settings_for(tmp_path / "seed", url, s3, prefix, jwks_file))
    ingest_paths([write_corpus(tmp_path / "corpus")], seed, embedder)
    env = gateway_env(
        GATEWAY_DATABASE_URL=url,
        GATEWAY_INDEX_URI=prefix,
        GATEWAY_DATA_DIR=str(tmp_path / "host-a"),
        **s3.env(),
    )
    # After its commit, the writer reads which generations replicas serve (to prune the
    # bucket): the table locked, it waits there, the lock still taken.
    hold = psycopg.connect(pg)
    hold.execute("LOCK TABLE replicas IN ACCESS EXCLUSIVE MODE")
    command = [gateway_command(), "acl", "set", "refund-policy", "--acl", "group:board"]
    a = reap(
        subprocess.Popen(
            [*command, "--tenant", "acme"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    )
    deadline = time.monotonic() + 180
    while not someone_waits_on(pg, hold):
        assert time.monotonic() < deadline and a.poll() is None, "never got there"
        time.sleep(0.05)
    assert seed.open_catalog().current_generation_id() == 2  # committed
    assert cut_generation_lock(pg) == 1
    hold.rollback()
    hold.close()
    out = a.communicate(timeout=120)[0].decode()
    assert a.returncode == 0, out
    assert "catalog_unavailable" not in out
    assert acl_of(seed, "refund-policy") == '["group:board"]'


def builds_in(layout: DataLayout) -> list[Path]:
    """Generations being built, or left by a writer that crashed while building one."""
    return [p for p in layout.lexical_root.iterdir() if p.name.startswith(".build-")]


@pytest.mark.server
@pytest.mark.parametrize("moment", ["before building", "while building", "while writing"])
def test_a_writer_that_lost_the_lock_leaves_a_shared_data_dir_s_generation_alone(
    postgres: Cluster,
    tmp_path: Path,
    embedder: Embedder,
    monkeypatch: pytest.MonkeyPatch,
    moment: str,
) -> None:
    """No object store: the writers of two hosts share one data dir (docs/operations.md,
    "`gateway serve`", its Replicas). Host A's lock session is cut before it builds
    generation 2, once it has made its hard-linked copy of generation 1, or once it writes
    into that copy; host B commits its own generation 2 meanwhile (removing A's copy, if
    made, as a crashed one). Before, A went on in `lexical/g000002`: it removed B's
    committed files and wrote its own there, and BM25 served A's build under B's catalog (a
    document revoked from staff was found)."""
    url = postgres.new_database()
    pg = url.replace("+psycopg", "")
    layout = DataLayout(tmp_path / "shared", url)
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    cut = tmp_path / "cut"

    def host_b_commits(now: str) -> None:
        # Host A has planned its change on generation 1, under the lock: its session is
        # cut, and host B revokes filler-0 from staff as generation 2.
        if now != moment or cut.exists():  # not yet, or host B's own write
            return
        cut.touch()
        assert cut_generation_lock(pg) == 1
        set_acl(DataLayout(layout.root, url), "acme", "filler-0", ["group:board"])

    def host_a_snapshot(source: Path | None, target: Path) -> None:
        host_b_commits("before building")
        snapshot_lexical(source, target)
        host_b_commits("while building")

    def host_a_index(*args: Any, **kwargs: Any) -> TantivyIndex:
        index = TantivyIndex(*args, **kwargs)
        host_b_commits("while writing")
        return index

    monkeypatch.setattr(writer, "snapshot_lexical", host_a_snapshot)
    monkeypatch.setattr(partitions, "TantivyIndex", host_a_index)
    with pytest.raises(GatewayError) as failed:
        set_acl(layout, "acme", "refund-policy", ["group:board"])
    assert failed.value.transient  # a worker queues the jobs again, a caller retries
    assert "generation lock was lost" in failed.value.detail

    number, bm25, dense = staff_lanes(layout, embedder)
    assert number == 2
    assert bm25 == dense, "host A's build replaced generation 2's files in the data dir"
    assert "filler-0@1:0" not in bm25 and "refund-policy@2:0" in bm25
    assert acl_of(layout, "filler-0") == '["group:board"]'
    assert acl_of(layout, "refund-policy") == '["group:staff"]'
    assert builds_in(layout) == []
    set_acl(layout, "acme", "refund-policy", ["group:board"])  # retried: it goes through
    number, bm25, dense = staff_lanes(layout, embedder)
    assert number == 3 and bm25 == dense and "refund-policy@2:0" not in bm25


# A writer killed once its generation is built, before it is put in place: it had opened
# merchant-fraud to staff (`gateway acl set`), a change never committed.
KILLED_AFTER_BUILDING = """
import os, sys
from pathlib import Path
from gateway.ingest import writer
from gateway.storage import partitions
from gateway.ingest.pipeline import set_acl
from gateway.storage.layout import DataLayout

apply = writer.LexicalIndex.apply

def apply_then_die(*args, **kwargs):
    apply(*args, **kwargs)
    os._exit(9)

writer.LexicalIndex.apply = apply_then_die
set_acl(DataLayout(Path(sys.argv[1])), "acme", "merchant-fraud", ["group:staff"])
"""


@pytest.mark.server
def test_a_crashed_writer_s_build_is_never_served_and_the_next_writer_removes_it(
    tmp_path: Path, embedder: Embedder
) -> None:
    layout = DataLayout(tmp_path / "data")
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_BUILDING, str(layout.root)],
        env=gateway_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert killed.returncode == 9, killed.stderr

    def merchant_fraud_in(chunks: set[str]) -> bool:
        return any(c.startswith("merchant-fraud@") for c in chunks)

    [left] = builds_in(layout)
    assert merchant_fraud_in(LexicalIndex(left, create=False).filter_only(STAFF))
    # A server's look at its data dir leaves it: it may be a live writer's.
    prune_lexical(layout, 1, unfinished=False)
    assert left.is_dir()
    number, bm25, dense = staff_lanes(layout, embedder)
    assert number == 1 and not merchant_fraud_in(bm25 | dense)
    set_acl(layout, "acme", "filler-0", ["group:board"])  # the next writer
    assert not left.exists() and builds_in(layout) == []
    number, bm25, dense = staff_lanes(layout, embedder)
    assert number == 2 and bm25 == dense
    assert not merchant_fraud_in(bm25) and "filler-0@1:0" not in bm25
