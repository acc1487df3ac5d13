"""A serving gateway and separate `gateway` processes changing its index: revocation takes
effect by the next request, readers never error, and kill -9 mid-ingest loses nothing."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from gateway.bench.server import gateway_command
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.restriction import Restriction
from gateway.storage.layout import DataLayout, open_served
from tests.helpers.documents import (
    SECRET,
    STAFF_EU,
    TODAY,
    big_batch,
    seed,
    tree_digest,
    write_doc,
)
from tests.helpers.identity import TokenFactory, bearer
from tests.helpers.processes import gateway_env, run_gateway, running_server, served_env

pytestmark = [pytest.mark.server, pytest.mark.long]

RISK = {"sub": "rita", "groups": ["risk"]}


@dataclass
class Hammer:
    """Searches as one caller, nonstop, from a thread; remembers what each request saw."""

    base: str
    token: str
    query: str
    seen: list[tuple[float, int, str]] = field(default_factory=list)  # start, status, body
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=30) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                r = client.post("/search", json={"query": self.query}, headers=bearer(self.token))
                self.seen.append((started, r.status_code, r.text))

    @property
    def thread(self) -> threading.Thread:
        return threading.Thread(target=self.run, daemon=True)

    def stop(self) -> None:
        self._stop.set()


@pytest.fixture
def live(
    tmp_path: Path, embedder: Embedder, jwks_file: Path
) -> Iterator[tuple[str, DataLayout, dict[str, str]]]:
    layout = seed(tmp_path, embedder)
    env = served_env(layout.root, jwks_file)
    with running_server(env) as (base, _process):
        yield base, layout, env


def wait_for(condition: Callable[[], bool], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the searches did not get that far"
        time.sleep(0.05)


def test_revoked_access_is_gone_by_the_next_request(
    live: tuple[str, DataLayout, dict[str, str]], make_token: TokenFactory
) -> None:
    base, _layout, env = live
    hammer = Hammer(base, make_token(**RISK), SECRET)
    thread = hammer.thread
    thread.start()
    try:
        wait_for(lambda: any(SECRET in body for _t, _s, body in hammer.seen))  # rita sees it
        result = run_gateway("acl", "set", "secret", "--acl", "group:board", env=env)
        done = time.monotonic()
        assert result.returncode == 0, result.stderr
        wait_for(lambda: sum(started > done for started, _s, _b in hammer.seen) >= 5)
    finally:
        hammer.stop()
        thread.join(timeout=30)
    after = [(status, body) for started, status, body in hammer.seen if started > done]
    assert len(after) >= 5
    assert all(status == 200 and SECRET not in body for status, body in after)
    assert all(status == 200 for _t, status, _b in hammer.seen)  # readers never erred
    # The document routes answer from the catalog, revoked in the same commit.
    document = httpx.get(f"{base}/documents/secret", headers=bearer(make_token(**RISK)))
    assert document.status_code == 404


def test_ingest_and_delete_are_visible_to_the_next_request(
    live: tuple[str, DataLayout, dict[str, str]], make_token: TokenFactory, tmp_path: Path
) -> None:
    base, _layout, env = live
    token = make_token()
    write_doc(
        tmp_path / "new",
        "n.md",
        {"doc_id": "fresh", **STAFF_EU, "effective_from": TODAY.isoformat()},
        "Freshly added rule FRS-1234.",
    )
    assert run_gateway("ingest", str(tmp_path / "new"), env=env).returncode == 0
    found = httpx.post(f"{base}/search", json={"query": "FRS-1234"}, headers=bearer(token))
    assert found.json()["results"][0]["doc_id"] == "fresh"
    assert run_gateway("delete", "fresh", env=env).returncode == 0
    gone = httpx.post(f"{base}/search", json={"query": "FRS-1234"}, headers=bearer(token))
    assert "fresh" not in {r["doc_id"] for r in gone.json()["results"]}


@pytest.mark.parametrize("moment", ["while embedding", "while writing the indexes"])
def test_kill_9_mid_ingest_leaves_the_served_generation_intact(
    tmp_path: Path, embedder: Embedder, moment: str
) -> None:
    layout = seed(tmp_path, embedder)
    before = tree_digest(layout.root)
    staff = Restriction("acme", frozenset({"group:staff"}), frozenset({"EU"}), TODAY)
    # Embedding is caught by its progress line (printed after EVERY_S seconds of it), so
    # that batch is large enough to take longer; the other only has to reach the indexes.
    count, short = (2000, False) if moment == "while embedding" else (240, True)
    process = subprocess.Popen(
        [gateway_command(), "ingest", str(big_batch(tmp_path / "bulk.jsonl", count, short))],
        env=gateway_env(GATEWAY_DATA_DIR=str(layout.root)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    said: list[str] = []
    stderr = process.stderr
    assert stderr is not None
    reader = threading.Thread(target=lambda: said.extend(iter(stderr.readline, "")))
    reader.start()  # drained, so a full pipe never blocks the ingest
    next_generation = layout.lexical(2)
    deadline = time.monotonic() + 120
    if moment == "while embedding":
        while not any(line.startswith("embedding: ") for line in said):
            assert time.monotonic() < deadline and process.poll() is None, "never embedded"
            time.sleep(0.05)
    else:
        while not next_generation.exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        assert next_generation.exists(), "the ingest never started writing"
    assert process.poll() is None, "ingest finished before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    reader.join()
    stderr.close()

    catalog = layout.open_catalog()
    assert catalog.current_generation_id() == 1
    assert len(catalog.all_documents()) == 2
    index = open_served(layout, catalog, embedder.name, embedder.dim)
    assert index is not None and index.lexical.filter_only(staff) == {"public@1:0"}
    assert index.vectors.filter_only(staff) == {"public@1:0"}
    if moment == "while embedding":
        assert tree_digest(layout.root) == before  # not a byte written
    # The next writer discards the leftovers and commits normally.
    report = ingest_paths([big_batch(tmp_path / "small.jsonl", 3)], layout, embedder)
    assert report.generation == 2
    index = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim)
    assert index is not None
    documents = {chunk_id.split("@")[0] for chunk_id in index.lexical.filter_only(staff)}
    assert documents == {"public", "bulk-0", "bulk-1", "bulk-2"}
    assert index.vectors.filter_only(staff) == index.lexical.filter_only(staff)
