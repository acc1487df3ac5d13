"""Measure the first searches after a start on a cold page cache, with the index files read
before ready (`GATEWAY_WARM_INDEX=auto`, the default) and without (`off`).

Each run pushes every file of the bench data dir out of the page cache (as a reboot, or
another program's reading, would), starts `gateway serve --no-worker`, and as soon as
`/readyz` says ready asks `--searches` bench questions from one client: how long the
start took, how many searches failed and why, and their latencies. The two ways
alternate, which goes first alternating too. Pushing files out needs no privilege
(`gateway.bench.pagecache.evict`), but another program on the host that maps them keeps
their pages in.

`--group-by document` asks by document; `--policy-dir P` serves another policy (one with
`retrieval.document_vector: mean`, say, whose documents' vectors the warm makes too).

Usage: PYTHONPATH=. python scripts/measure_cold_start.py --data-dir D [--runs 3]
[--group-by document] [--policy-dir P]
(D: a `gateway bench --chunks 1000000 --data-dir D` data dir)
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

from gateway.bench import synthetic
from gateway.bench.load import drive, percentiles
from gateway.bench.pagecache import evict
from gateway.bench.runner import MANIFEST
from gateway.bench.server import running_gateway, throwaway_issuer

WAYS = ("auto", "off")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="a gateway bench data dir")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--searches", type=int, default=50, help="after each start")
    parser.add_argument("--selectivity", type=float, default=0.1)
    parser.add_argument("--group-by", choices=("chunk", "document"), default="chunk")
    parser.add_argument("--policy-dir", type=Path, help="serve this policy directory")
    args = parser.parse_args()

    data = args.data_dir.resolve()
    pool = json.loads((data / MANIFEST).read_text())["queries"]
    work = Path(tempfile.mkdtemp(prefix="measure-cold-start-"))
    issuer = throwaway_issuer(work, data)
    token = issuer.token(
        synthetic.TENANT, synthetic.REGION, tuple(synthetic.caller_groups(args.selectivity))
    )
    env = dict(issuer.env)
    if args.policy_dir is not None:
        env["GATEWAY_POLICY_DIR"] = str(args.policy_dir.resolve())
    body = {"group_by": "document"} if args.group_by == "document" else None
    for run in range(args.runs):
        for way in WAYS if run % 2 == 0 else WAYS[::-1]:
            questions = random.Random(run).sample(pool, args.searches)
            files = evict(data)
            with running_gateway(
                ["serve", "--no-worker"], {**env, "GATEWAY_WARM_INDEX": way}
            ) as served:
                phase = drive(served.base, token, "/search", questions, 1, body)
            first = phase.latencies_ms[0] if phase.latencies_ms else None
            print(
                f"run {run + 1}, warm_index {way}: ready in {served.startup_s:.2f} s "
                f"({files} files pushed out first); {len(questions)} searches: "
                f"failed {phase.errors} {dict(phase.failures)}, degraded {phase.degraded}, first "
                f"{'-' if first is None else f'{first:.1f}'} ms, "
                f"{percentiles(phase.latencies_ms, (50, 95, 100))}",
                flush=True,
            )


if __name__ == "__main__":
    main()
