"""Ready means warm (`GATEWAY_WARM_INDEX`): before `/readyz` says ready the served
generation's files are read into the page cache (within half the available memory) and
its partitions opened, so that its first searches neither read from disk nor open
anything inside their budgets; a newer generation is served at once and warmed by the
watcher next."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.bench.pagecache import evict, resident_bytes
from gateway.embedding import MODEL_NAME, Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.storage import warm
from gateway.storage.current import ServedIndexes
from gateway.storage.flatfile import copy_directory
from gateway.storage.layout import DataLayout, ServedIndex, open_served
from gateway.storage.warm import available_bytes, index_files, read_through, warm_index
from tests.helpers.documents import STAFF_EU, write_doc
from tests.helpers.identity import TokenFactory, bearer, make_settings


@pytest.fixture
def any_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """No memory budget: a test about something else must not depend on the host's (or
    its container's) free memory."""
    monkeypatch.setattr(warm, "available_bytes", lambda: None)


def _copy_of(data_dir: Path, tmp_path: Path) -> tuple[Path, DataLayout]:
    """A copy of the suite's data dir, which a test may change."""
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    return copy, DataLayout(copy)


def _cached_share(paths: list[Path]) -> float:
    resident = total = 0
    for path in paths:
        cached, size = resident_bytes(path)
        resident, total = resident + cached, total + size
    return resident / total


def _cold_copy(data_dir: Path, tmp_path: Path) -> tuple[Path, list[Path]]:
    """A copy of the suite's data dir pushed out of the page cache, and the files a search
    reads: the Tantivy files, then the vector copy's."""
    copy, layout = _copy_of(data_dir, tmp_path)
    served = open_served(layout, layout.open_catalog(), MODEL_NAME, 384)
    assert served is not None
    flat = sorted(copy_directory(layout.flat_root, served.number).glob("*.npy"))
    files = [*index_files(layout, served), *flat]
    del served
    evict(copy)
    if _cached_share(files) > 0.2:  # e.g. tmpfs, which keeps every page in memory
        pytest.skip("this file system keeps the files in memory: nothing to warm")
    return copy, files


@pytest.mark.usefixtures("any_memory")
def test_partitions_open_before_the_first_search(data_dir: Path, tmp_path: Path) -> None:
    _, layout = _copy_of(data_dir, tmp_path)
    served = open_served(layout, layout.open_catalog(), MODEL_NAME, 384)
    assert served is not None and served.lexical.opened == []
    on_disk = sorted(d.name for d in served.lexical.path.iterdir() if d.is_dir())
    assert on_disk and any(name.startswith("d-") for name in on_disk)

    warmed = warm_index(layout, served)

    assert sorted(served.lexical.opened) == on_disk
    assert warmed is not None and warmed.partitions == len(on_disk) and not warmed.left_bytes
    again = open_served(layout, layout.open_catalog(), MODEL_NAME, 384)
    assert again is not None
    one = warm_index(layout, again, on_disk[:1], "on change")
    assert one is not None and one.partitions == 1
    assert again.lexical.opened == on_disk[:1]  # only those asked for


@pytest.mark.usefixtures("any_memory")
def test_document_vectors_are_made_ahead_where_the_policy_ranks_by_them(
    data_dir: Path, tmp_path: Path
) -> None:
    """`retrieval.document_vector` (mean or first) ranks documents by their chunks' vectors,
    made on first use: at 1M 2.2-4.1 s of a first search by document, past its budget.
    The warm makes them where the policy asks, and only there."""
    _, layout = _copy_of(data_dir, tmp_path)

    def served_by(indexes: ServedIndexes) -> ServedIndex:
        return asyncio.run(indexes.current())

    catalog = layout.open_catalog()
    asked = served_by(
        ServedIndexes(layout, catalog, MODEL_NAME, 384, warm=True, vector_documents=lambda: True)
    )
    assert asked.flat._documents_made is not None
    made = asked.flat.documents()
    assert asked.flat.documents() is made  # made once, by the warm
    plain = served_by(ServedIndexes(layout, catalog, MODEL_NAME, 384, warm=True))
    assert plain.flat._documents_made is None
    changed = open_served(layout, catalog, MODEL_NAME, 384)  # as the watcher warms one
    assert changed is not None
    warm_index(layout, changed, None, "on change", documents=True)
    assert changed.flat._documents_made is not None


@pytest.mark.sleeps
@pytest.mark.usefixtures("any_memory")
def test_a_policy_that_comes_to_rank_by_vector_has_them_made_by_the_watcher(
    data_dir: Path, tmp_path: Path
) -> None:
    """Turned on by a reload after the generation was warmed: the watcher makes the
    document vectors in the background, before a search by document would."""
    _, layout = _copy_of(data_dir, tmp_path)
    asks = [False]
    indexes = ServedIndexes(
        layout, layout.open_catalog(), MODEL_NAME, 384, warm=True,
        vector_documents=lambda: asks[0],
    )  # fmt: skip

    async def reloaded() -> ServedIndex:
        served = await indexes.current()
        watcher = asyncio.create_task(indexes.watch(0.01))
        try:
            await asyncio.sleep(0.1)
            assert served.flat._documents_made is None  # not asked for: not made
            asks[0] = True  # the policy reloaded with `document_vector: mean`
            for _ in range(1000):
                if served.flat._documents_made is not None:
                    break
                await asyncio.sleep(0.01)
        finally:
            watcher.cancel()
        return served

    assert asyncio.run(reloaded()).flat._documents_made is not None


@pytest.mark.usefixtures("any_memory")
def test_a_partition_that_cannot_open_is_left_to_its_searches(
    data_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _, layout = _copy_of(data_dir, tmp_path)
    served = open_served(layout, layout.open_catalog(), MODEL_NAME, 384)
    assert served is not None
    chunks = sorted(d for d in served.lexical.path.iterdir() if d.name.startswith("t-"))
    (chunks[0] / "meta.json").write_text("not Tantivy's")

    indexes = ServedIndexes(layout, layout.open_catalog(), MODEL_NAME, 384, warm=True)

    opened = indexes.served.lexical.opened if indexes.served else []
    assert chunks[0].name not in opened and chunks[1].name in opened
    assert f"partition {chunks[0].name} not opened ahead" in caplog.text
    # Its document partition is no longer in step with it: no search would use it.
    assert "d-" + chunks[0].name[2:] not in opened and "d-" + chunks[1].name[2:] in opened


@pytest.mark.usefixtures("any_memory")
def test_a_warm_that_fails_does_not_stop_the_start(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, layout = _copy_of(data_dir, tmp_path)

    def fails(*_args: object) -> object:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(warm, "read_through", fails)
    indexes = ServedIndexes(layout, layout.open_catalog(), MODEL_NAME, 384, warm=True)

    assert indexes.served is not None and not indexes.warming_first
    assert asyncio.run(indexes.current()) is indexes.served


@pytest.mark.model
@pytest.mark.usefixtures("any_memory")
def test_ready_means_the_index_files_are_in_memory(
    data_dir: Path,
    jwks_file: Path,
    embedder: Embedder,
    make_token: TokenFactory,
    tmp_path: Path,
) -> None:
    copy, files = _cold_copy(data_dir, tmp_path)
    app = create_app(make_settings(copy, jwks_file), embedder=embedder)
    with TestClient(app) as client:
        assert client.get("/readyz").status_code == 200
        assert _cached_share(files) > 0.99
        found = client.post("/search", json={"query": "risk"}, headers=bearer(make_token()))
        assert found.status_code == 200


@pytest.mark.model
def test_off_leaves_the_files_to_the_first_searches(
    data_dir: Path, jwks_file: Path, embedder: Embedder, tmp_path: Path
) -> None:
    copy, files = _cold_copy(data_dir, tmp_path)
    settings = make_settings(copy, jwks_file).model_copy(update={"warm_index": "off"})
    with TestClient(create_app(settings, embedder=embedder)) as client:
        assert client.get("/readyz").status_code == 200
        matrix = next(p for p in files if p.name == "matrix.npy")
        postings = [p for p in files if p.suffix == ".idx"]
        assert postings and _cached_share([matrix, *postings]) < 0.5


def test_files_past_the_budget_are_left_unread(tmp_path: Path) -> None:
    sizes = {"first": 3 << 20, "second": 5 << 20, "third": 1 << 20}
    paths = []
    for name, size in sizes.items():
        path = tmp_path / name
        path.write_bytes(b"x" * size)
        paths.append(path)
    evict(tmp_path)
    if _cached_share(paths) > 0.2:
        pytest.skip("this file system keeps the files in memory: nothing to warm")

    warmed = read_through([*paths[:1], tmp_path / "removed meanwhile", *paths[1:]], 6 << 20)

    # The second would pass the budget: it and the third, needed later, stay unread.
    assert warmed == (1, 3 << 20, 6 << 20)
    assert _cached_share(paths[:1]) > 0.99
    assert _cached_share(paths[1:]) < 0.2
    assert read_through(paths, None) == (3, 9 << 20, 0)


def test_the_budget_is_the_smaller_of_the_host_and_the_container(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:    8000000 kB\n")
    parent = tmp_path / "cgroup"
    own = parent / "pod"
    own.mkdir(parents=True)
    for group in (parent, own):
        (group / "memory.max").write_text("max\n")
    assert available_bytes(meminfo, own) == 8_000_000 * 1024

    (own / "memory.max").write_text(f"{3 << 30}\n")
    (own / "memory.current").write_text(f"{2 << 30}\n")
    (own / "memory.stat").write_text(f"anon {1 << 30}\ninactive_file {1 << 29}\n")
    # Its inactive page cache counts as free: the kernel takes it back first.
    assert available_bytes(meminfo, own) == (1 << 30) + (1 << 29)

    (own / "memory.current").write_text(f"{4 << 30}\n")  # over its limit: nothing to spare
    assert available_bytes(meminfo, own) == 0

    (own / "memory.current").write_text(f"{1 << 30}\n")
    (parent / "memory.max").write_text(f"{1 << 30}\n")  # a limit above it counts too
    (parent / "memory.current").write_text(f"{(1 << 30) - (1 << 20)}\n")
    (parent / "memory.stat").write_text("inactive_file 0\n")
    assert available_bytes(meminfo, own) == 1 << 20
    assert available_bytes(tmp_path / "none", tmp_path / "none") is None


@pytest.mark.model
@pytest.mark.usefixtures("any_memory")
def test_a_newer_generation_is_warmed_after_it_is_served(
    data_dir: Path, embedder: Embedder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, layout = _copy_of(data_dir, tmp_path)
    served = {
        warm: ServedIndexes(layout, layout.open_catalog(), MODEL_NAME, 384, warm=warm)
        for warm in (True, False)
    }
    before = asyncio.run(served[True].current())
    assert before.lexical.opened and asyncio.run(served[False].current()).lexical.opened == []
    docs = tmp_path / "docs"
    dated = {"effective_from": "2020-01-01"}
    write_doc(docs, "old.md", {"doc_id": "warm-old", **STAFF_EU, **dated}, "A served tenant.")
    new_tenant = {**STAFF_EU, "tenant": "warm-newcomer", **dated}
    write_doc(docs, "new.md", {"doc_id": "warm-new", **new_tenant}, "A tenant not served yet.")
    ingest_paths([docs], layout, embedder)

    newer = asyncio.run(served[True].current())

    # Served at once, not warmed on the request's path: the watcher does that next.
    assert newer.number > before.number and newer.lexical.opened == []
    parsed: list[bool] = []
    loads = json.loads

    def counted(data: str | bytes) -> object:
        parsed.append(isinstance(data, bytes))  # a rows file (meta.json is read as text)
        return loads(data)

    monkeypatch.setattr(json, "loads", counted)
    served[True].warm_pending()
    # Opened: the partitions served so far (the newer generation's own copies of them),
    # not the new tenant's, which its first search opens.
    on_disk = {d.name for d in newer.lexical.path.iterdir() if d.is_dir()}
    assert len(on_disk) == len(before.lexical.opened) + 2
    assert sorted(newer.lexical.opened) == sorted(before.lexical.opened)
    # Their row names came from the generation before: only the files the ingest added
    # to the served tenant's two partitions were read.
    files = [f for name in newer.lexical.opened for f in (newer.lexical.path / name).glob("rows-*")]
    assert sum(parsed) == 2 < len(files)


@pytest.mark.model
@pytest.mark.sleeps
@pytest.mark.usefixtures("any_memory")
def test_the_server_warms_a_newer_generation_in_the_background(
    data_dir: Path,
    jwks_file: Path,
    embedder: Embedder,
    make_token: TokenFactory,
    tmp_path: Path,
) -> None:
    copy, layout = _copy_of(data_dir, tmp_path)
    app = create_app(make_settings(copy, jwks_file), embedder=embedder)
    with TestClient(app) as client:
        indexes = app.state.gateway.indexes
        at_start, first = sorted(indexes.served.lexical.opened), indexes.served.number
        docs = tmp_path / "docs"
        dated = {**STAFF_EU, "effective_from": "2020-01-01"}
        write_doc(docs, "new.md", {"doc_id": "warm-bg", **dated}, "A newer generation.")
        ingest_paths([docs], layout, embedder)
        found = client.post("/search", json={"query": "risk"}, headers=bearer(make_token()))
        assert found.json()["index_generation"] == indexes.served.number > first
        deadline = time.monotonic() + 10
        while sorted(indexes.served.lexical.opened) != at_start and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(indexes.served.lexical.opened) == at_start


@pytest.mark.model
@pytest.mark.usefixtures("any_memory")
def test_the_first_generation_of_an_empty_data_dir_is_ready_once_warmed(
    corpus_dir: Path, embedder: Embedder, tmp_path: Path
) -> None:
    layout = DataLayout(tmp_path / "data")
    indexes = ServedIndexes(layout, layout.open_catalog(), MODEL_NAME, 384, warm=True)
    assert indexes.served is None and not indexes.warming_first
    ingest_paths([corpus_dir], layout, embedder)

    first = asyncio.run(indexes.current())  # a request opens it: served, not yet warm

    assert first.lexical.opened == [] and indexes.warming_first
    indexes.warm_pending()
    on_disk = {d.name for d in first.lexical.path.iterdir() if d.is_dir()}
    assert set(first.lexical.opened) == on_disk and not indexes.warming_first
