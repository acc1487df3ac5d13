"""Ready means warm: before `/readyz` says ready the served generation's files are read into
the page cache (`GATEWAY_WARM_INDEX`), within half the available memory, so that the
first searches after a start on a cold cache do not read them from disk."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.bench.pagecache import evict, resident_bytes
from gateway.embedding import MODEL_NAME, Embedder
from gateway.storage.layout import DataLayout, open_served
from gateway.storage.warm import available_bytes, index_files, read_through
from tests.helpers.identity import TokenFactory, bearer, make_settings


def _cached_share(paths: list[Path]) -> float:
    resident = total = 0
    for path in paths:
        cached, size = resident_bytes(path)
        resident, total = resident + cached, total + size
    return resident / total


def _cold_copy(data_dir: Path, tmp_path: Path) -> tuple[Path, list[Path]]:
    """A copy of the suite's data dir pushed out of the page cache, and its index files."""
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    layout = DataLayout(copy)
    served = open_served(layout, layout.open_catalog(), MODEL_NAME, 384)
    assert served is not None
    files = index_files(layout, served)
    del served
    evict(copy)
    if _cached_share(files) > 0.2:  # e.g. tmpfs, which keeps every page in memory
        pytest.skip("this file system keeps the files in memory: nothing to warm")
    return copy, files


def test_files_come_in_the_order_a_search_reads_them(data_dir: Path, tmp_path: Path) -> None:
    copy, files = _cold_copy(data_dir, tmp_path)
    names = [p.relative_to(copy).parts[0] for p in files]
    assert names == sorted(names, key=["lexical", "flat"].index)  # BM25's first
    vectors = [p.name for p in files if p.relative_to(copy).parts[0] == "flat"]
    assert vectors.index("rows.arrow") < vectors.index("matrix.npy")
    assert not any(p.relative_to(copy).parts[0] == "vectors" for p in files)


@pytest.mark.model
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
    assert (warmed.files, warmed.read_bytes, warmed.left_bytes) == (1, 3 << 20, 6 << 20)
    assert _cached_share(paths[:1]) > 0.99
    assert _cached_share(paths[1:]) < 0.2
    assert read_through(paths, None).read_bytes == 9 << 20


def test_the_budget_is_the_smaller_of_the_host_and_the_container(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:    8000000 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("max\n")
    assert available_bytes(meminfo, cgroup) == 8_000_000 * 1024
    (cgroup / "memory.max").write_text(f"{3 << 30}\n")
    (cgroup / "memory.current").write_text(f"{1 << 30}\n")
    assert available_bytes(meminfo, cgroup) == 2 << 30
    (cgroup / "memory.current").write_text(f"{4 << 30}\n")  # over its limit: nothing to spare
    assert available_bytes(meminfo, cgroup) == 0
    assert available_bytes(tmp_path / "none", tmp_path / "none") is None
