"""Measure how fast a replica starts, and how fast it takes a new generation (issue 18).

On an existing data dir (e.g. `gateway bench --chunks 1000000 --data-dir D` leaves one):

1. startup, from starting `gateway serve --no-worker` to `/readyz` 200, in alternated runs:
   this code with the generation's vector copy already in `D/flat` ("mapped"), this code
   with it removed first ("built", the first start on a host), and, with `--old-tree`, the
   code of another checkout (e.g. `git worktree add /tmp/old <commit>`), which always read
   every vector from the table;
2. a new generation: one small document is ingested into D, then the copy of the new
   generation is built from the previous one (only the vectors it adds are read) and, for
   comparison, from the table alone; in process, timed.

The index files are on local disk and in the page cache (the runs before warm it): "once
its files are local", as the issue puts it. Usage:
  PYTHONPATH=. python scripts/measure_start.py --data-dir D [--runs 3] [--old-tree /tmp/old]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from gateway.bench.server import memory_mb, running_gateway, throwaway_issuer
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.storage.flat import FlatVectors
from gateway.storage.layout import DataLayout, open_served


def start_once(data: Path, work: Path, tree: str | None, built: bool) -> tuple[float, float]:
    """(seconds to ready, resident MB once ready)."""
    if built:
        shutil.rmtree(data / "flat", ignore_errors=True)
    env = dict(throwaway_issuer(work, data).env)
    env.pop("PYTHONPATH", None)
    if tree:
        env["PYTHONPATH"] = tree  # before the editable install on sys.path
    with running_gateway(["serve", "--no-worker"], env) as served:
        return served.startup_s, memory_mb(served.pid).get("rss", 0.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--old-tree", default=None)
    args = parser.parse_args()
    data: Path = args.data_dir
    work = Path(tempfile.mkdtemp(prefix="measure-start-"))
    os.chdir(work)  # so the interpreter's working directory never shadows --old-tree

    kinds = ["mapped", "built"] + (["old"] if args.old_tree else [])
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    start_once(data, work, None, built=False)  # warms the page cache, leaves a copy
    for run in range(args.runs):
        for kind in kinds:
            tree = args.old_tree if kind == "old" else None
            times[kind].append(start_once(data, work, tree, built=kind == "built"))
            print(f"run {run + 1} {kind}: {times[kind][-1][0]:.2f} s, {times[kind][-1][1]} MB")
    for kind, found in times.items():
        seconds = sorted(t for t, _ in found)
        print(f"{kind}: startup median {seconds[len(seconds) // 2]:.2f} s {seconds}")

    embedder = Embedder()
    layout = DataLayout(data)
    catalog = layout.open_catalog()
    before = open_served(layout, catalog, embedder.name, embedder.dim)
    assert before is not None
    doc = work / "docs" / "start-probe.md"
    doc.parent.mkdir()
    stamp = time.time_ns()
    doc.write_text(
        f"---\ndoc_id: start-probe-{stamp}\ntenant: bench\nregion: EU\nacl: [group:l0]\n"
        f"effective_from: 2020-01-01\n---\nA probe document {stamp} for the start measure.\n"
    )
    ingest_paths([doc.parent], layout, embedder)
    generation = catalog.current_generation()
    assert generation is not None
    vectors = layout.open_vectors(
        generation.dim, version=generation.vector_version, table=generation.vector_table
    )
    for label, base in (("from the previous copy", before.flat), ("from the table", None)):
        started = time.perf_counter()
        flat = FlatVectors.build(vectors.snapshot(), base)
        print(
            f"new generation {generation.id}, copy {label}: {time.perf_counter() - started:.2f} s"
        )
        del flat
    started = time.perf_counter()
    open_served(layout, catalog, embedder.name, embedder.dim, before)
    print(f"new generation opened as a server does: {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
