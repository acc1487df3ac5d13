"""Time the exact dense search's half-precision screen of scattered rows (issue 32): the
rows a caller may see, when they form no long runs in the table's order, are gathered and
scored in one pass (`FlatVectors._screen`). On a random table of `--rows` unit vectors
(384 dimensions, half precision), for universes of each `--sizes` rows drawn at random,
on one thread: this code and, with `--old-tree`, the code of another checkout (e.g.
`git worktree add /tmp/old <commit>`), each in its own process, runs alternated.

Usage: PYTHONPATH=. python scripts/measure_screen.py [--rows 200000]
       [--sizes 5000 20000 50000] [--runs 5] [--repeat 20] [--old-tree DIR]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

DIM = 384


def timed(rows: int, sizes: list[int], repeat: int) -> str:
    """One line: the mean milliseconds a screen of each size took, in this process."""
    import numpy as np
    import torch

    from gateway.cli.options import one_blas_thread
    from gateway.storage.flat import FlatVectors

    one_blas_thread()
    rng = np.random.default_rng(0)
    table = FlatVectors.__new__(FlatVectors)  # only the screen's own state is needed
    table._screened = torch.from_numpy(
        rng.standard_normal((rows, DIM), dtype=np.float32).astype(np.float16)
    )
    query = rng.standard_normal(DIM).astype(np.float32)
    query /= np.linalg.norm(query)
    timings = []
    for size in sizes:
        universe = np.sort(rng.choice(rows, size, replace=False))
        table._screen(universe, query)  # warm
        started = time.perf_counter()
        for _ in range(repeat):
            table._screen(universe, query)
        timings.append(f"{size} rows {(time.perf_counter() - started) / repeat * 1000:.2f} ms")
    return "; ".join(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[5_000, 20_000, 50_000])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=20, help="screens timed per size")
    parser.add_argument("--old-tree", help="also time the code of this checkout")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child run
    args = parser.parse_args()
    if args.one:
        print(timed(args.rows, args.sizes, args.repeat), flush=True)
        return
    trees = {"this code": os.getcwd()}
    if args.old_tree:
        trees[f"code of {args.old_tree}"] = args.old_tree
    child = [sys.executable, os.path.abspath(__file__), "--one", "--rows", str(args.rows),
             "--repeat", str(args.repeat), "--sizes", *map(str, args.sizes)]  # fmt: skip
    for run in range(args.runs):
        order = list(trees.items())
        for name, tree in order if run % 2 == 0 else order[::-1]:
            env = {**os.environ, "PYTHONPATH": tree}
            line = subprocess.run(child, env=env, capture_output=True, text=True, check=True)
            print(f"run {run + 1}, {name}: {line.stdout.strip()}", flush=True)


if __name__ == "__main__":
    main()
