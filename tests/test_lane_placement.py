"""`GATEWAY_LANE_CPUS=split`: the dense lane's workers on their own CPUs, the other lanes'
workers and the audit writer on the rest, nothing else restricted (the writer process of
`gateway serve` included); `shared` restricts nothing; `auto`, the default, splits a lone
process on two CPUs only."""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.embedding.onnx_query import QUERY_THREADS, OnnxQueryEncoder, query_threads
from gateway.placement import Placement
from gateway.retrieval.fair import FairExecutor
from tests.helpers.documents import seed
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.processes import allowed_cpus, children, running_server, served_env, until

ALLOWED = frozenset(os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else ())
two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="fewer than two CPUs to pin threads to")


def test_split_gives_the_dense_lane_the_upper_half_and_shared_nothing() -> None:
    assert Placement.plan("split", [0, 1]) == Placement(frozenset({1}), frozenset({0}))
    assert Placement.plan("split", [4, 2, 3]) == Placement(frozenset({3, 4}), frozenset({2}))
    split = Placement.plan("split", range(8))
    assert split.for_lane("dense") == frozenset({4, 5, 6, 7})
    assert split.for_lane("bm25") == split.for_lane("exact") == frozenset({0, 1, 2, 3})
    assert Placement.plan("split", [5]) == Placement()  # one CPU: nothing to split
    assert Placement.plan("shared", [0, 1]) == Placement()
    assert Placement().for_lane("dense") is None


def test_auto_splits_a_lone_process_on_two_cpus_only() -> None:
    """Where `split` was measured to gain: one serving process, two CPUs. Not for one of a
    group's processes (all would put their dense lanes on the same CPUs), nor on other
    counts of CPUs, where its gain is unmeasured."""
    assert Placement.plan("auto", [0, 1]) == Placement.plan("split", [0, 1])
    assert Placement.plan("auto", [0, 1]).kind == "split"
    assert Placement.plan("auto", [0, 1], alone=False) == Placement()
    assert Placement.plan("split", [0, 1], alone=False).kind == "split"  # as set
    for cpus in ([3], [0, 1, 2], range(4), range(16)):
        assert Placement.plan("auto", cpus) == Placement()
        assert Placement.plan("auto", cpus).kind == "shared"


@two_cpus
def test_a_split_app_runs_each_lane_on_its_cpus_and_still_answers(
    data_dir: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    settings = make_settings(data_dir, jwks_file).model_copy(update={"lane_cpus": "split"})
    planned = Placement.plan("split", ALLOWED)
    ann = bearer(make_token(sub="ann", tenant="acme", groups=["staff"]))
    # Apps other tests of this process keep open (`auto` splits them on two CPUs) have
    # pinned threads of their own: only this app's are looked at.
    before = {t.native_id for t in threading.enumerate()}
    with TestClient(create_app(settings, embedder=embedder)) as client:
        found = client.post("/search", json={"query": "refund RPL-14"}, headers=ann)
        assert found.status_code == 200, found.text
        assert found.json()["results"] and found.json()["degraded"] == []
        state = client.app.state.gateway  # type: ignore[attr-defined]
        # BM25's workers for its whole documents run anywhere: pinned with its chunks'
        # search, the two took turns on one CPU of two.
        placed = {
            thread.native_id: ALLOWED if "-beside-" in thread.name else planned.for_lane(pool.name)
            for pool in state.searcher.pools
            for thread in pool.threads
        }
        placed[state.audit.thread.native_id] = planned.others
        # three lanes of four workers, BM25's four for its documents, one audit writer
        assert len(placed) == 3 * 4 + 4 + 1
        assert sum(cpus == ALLOWED for cpus in placed.values()) == 4

        def all_placed() -> bool:
            return all(os.sched_getaffinity(tid) == cpus for tid, cpus in placed.items())

        until(all_placed, seconds=10)
        others = [t.native_id for t in threading.enumerate() if t.native_id not in placed]
        mine = [tid for tid in others if tid not in before]
        assert mine and all(os.sched_getaffinity(tid) == ALLOWED for tid in mine)


def test_float32_queries_take_no_more_threads_than_the_dense_lane_has_cpus() -> None:
    assert query_threads(frozenset({1})) == 1
    assert query_threads(frozenset({4, 5, 6, 7})) == QUERY_THREADS == 2
    # Shared: as many as the process may use (a container's cpuset), not the host's.
    assert query_threads([3]) == 1
    assert query_threads(range(16)) == 2
    assert query_threads() == min(2, len(ALLOWED))


@two_cpus
@pytest.mark.parametrize("lane_cpus", ["split", "shared"])
def test_an_app_embeds_float32_queries_on_the_dense_lanes_cpus(
    data_dir: Path, jwks_file: Path, lane_cpus: str
) -> None:
    """Split on two CPUs, ONNX Runtime's second thread would run on the other lanes' CPU."""
    settings = make_settings(data_dir, jwks_file).model_copy(update={"lane_cpus": lane_cpus})
    model = Embedder(precision="float32")  # int8 queries run on one thread anyway
    with TestClient(create_app(settings, embedder=model)):
        encoder = model._fast
        assert isinstance(encoder, OnnxQueryEncoder) and encoder.precision == "float32"
        planned = Placement.plan(lane_cpus, ALLOWED)  # type: ignore[arg-type]
        assert encoder.threads == (1 if len(ALLOWED) == 2 and lane_cpus == "split" else 2)
        assert encoder.threads == query_threads(planned.dense)


def test_a_shared_app_restricts_no_thread(
    data_dir: Path, jwks_file: Path, embedder: Embedder
) -> None:
    settings = make_settings(data_dir, jwks_file).model_copy(update={"lane_cpus": "shared"})
    with TestClient(create_app(settings, embedder=embedder)) as client:
        state = client.app.state.gateway  # type: ignore[attr-defined]
        threads = [t for pool in state.searcher.pools for t in pool.threads]
        for thread in [*threads, state.audit.thread]:
            assert os.sched_getaffinity(thread.native_id) == ALLOWED


@pytest.mark.server
@two_cpus
def test_a_served_split_pins_the_lanes_only_and_not_the_writer(
    tmp_path: Path, embedder: Embedder, jwks_file: Path
) -> None:
    """A real `gateway serve`: its lane workers on their halves, its writer process (a
    child, which inherits the CPUs of the thread that starts it) on every CPU."""
    layout = seed(tmp_path, embedder)
    env = served_env(layout.root, jwks_file, GATEWAY_LANE_CPUS="split")
    planned = Placement.plan("split", ALLOWED)
    with running_server(env, worker=True) as (base, server):
        assert httpx.get(f"{base}/readyz", timeout=30).status_code == 200
        tasks = Path(f"/proc/{server.pid}/task")
        placed = Counter(allowed_cpus(task / "status") for task in tasks.iterdir())
        assert placed[planned.dense] == 4  # the dense lane's workers
        # BM25's chunks', the identifier lane's, the audit writer
        assert placed[planned.others] == 2 * 4 + 1
        assert placed[ALLOWED] > 4  # BM25's documents', the event loop and the rest
        writers = children(server.pid)
        assert len(writers) == 1, f"one writer process expected, found {writers}"
        assert allowed_cpus(Path(f"/proc/{writers.pop()}/status")) == ALLOWED


def test_cpus_that_cannot_be_had_leave_the_lane_working_anywhere(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker whose CPUs are refused (none this process may use) still serves its lane."""
    missing = frozenset({max(ALLOWED) + 1024})
    executor = FairExecutor(1, "dense", missing)
    try:
        assert executor.submit("acme", lambda: 42).result(timeout=10) == 42
        (thread,) = executor.threads
        assert os.sched_getaffinity(thread.native_id) == ALLOWED
    finally:
        executor.shutdown()
    assert any("refused" in r.getMessage() for r in caplog.records)
