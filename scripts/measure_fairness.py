"""Measure fairness between tenants (issue 19): tenant B's `/search` latency alone, and
while tenant A floods the same server from many clients.

On a `gateway bench` data dir (tenant `bench` holds most chunks; `other-tenant` holds the
decoys, a few percent): A is `bench` at 100% selectivity, the heaviest universe; B is
`other-tenant`. B sends one request at a time. With `--old-tree` (a checkout of other code,
e.g. the lane pools before they took turns by tenant), the same runs against that code,
alternated. Usage:
  PYTHONPATH=. python scripts/measure_fairness.py --data-dir D [--old-tree DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

from gateway.bench import synthetic
from gateway.bench.load import drive, percentiles
from gateway.bench.server import running_gateway, throwaway_issuer

QUESTIONS = [
    f"how must the {team} team {verb} a {thing} ticket {n}"
    for n in range(40)
    for team in ("payroll", "legal", "security", "finance", "support")
    for verb in ("archive", "approve", "review")
    for thing in ("invoice", "contract", "laptop")
]


def run(
    data: Path, work: Path, tree: str | None, queries: int, clients: int
) -> dict[str, dict[str, float]]:
    issuer = throwaway_issuer(work, data)
    env = dict(issuer.env)
    env.pop("PYTHONPATH", None)
    if tree:
        env["PYTHONPATH"] = tree
    flood = issuer.token(synthetic.TENANT, synthetic.REGION, tuple(synthetic.caller_groups(1.0)))
    quiet = issuer.token("other-tenant", synthetic.REGION, tuple(synthetic.caller_groups(1.0)))
    asked = iter(range(10**9))

    def questions(n: int) -> list[str]:
        return [QUESTIONS[next(asked) % len(QUESTIONS)] for _ in range(n)]

    with running_gateway(["serve", "--no-worker"], env) as server:
        drive(server.base, quiet, "/search", questions(20), 1)  # warm
        drive(server.base, flood, "/search", questions(20), 1)
        alone = drive(server.base, quiet, "/search", questions(queries), 1)
        stop = threading.Event()
        flooded: list[float] = []

        def hammer() -> None:
            while not stop.is_set():
                flooded.extend(drive(server.base, flood, "/search", questions(20), 1).latencies_ms)

        threads = [threading.Thread(target=hammer) for _ in range(clients)]
        for thread in threads:
            thread.start()
        time.sleep(2)  # the flood is on
        during = drive(server.base, quiet, "/search", questions(queries), 1)
        stop.set()
        for thread in threads:
            thread.join()
    return {
        "B alone": percentiles(alone.latencies_ms),
        "B during A's flood": percentiles(during.latencies_ms),
        "A (flooding)": percentiles(flooded),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--old-tree", default=None)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="measure-fairness-"))
    os.chdir(work)  # so the interpreter's working directory never shadows --old-tree
    kinds = [("this code", None)] + ([("old code", args.old_tree)] if args.old_tree else [])
    for round_ in range(args.rounds):
        for name, tree in kinds if round_ % 2 == 0 else kinds[::-1]:
            for label, figures in run(
                args.data_dir, work, tree, args.queries, args.clients
            ).items():
                print(f"round {round_ + 1}, {name}: {label}: {figures}")


if __name__ == "__main__":
    main()
