"""Measure `/search` on a `gateway bench` data dir (issue 32's hot path), by chunk or
`--group-by document`: from one client and from C clients, this code against another
checkout (`--old-tree`), one server at a time, in rounds whose order alternates (these
machines drift by 10% or more).

For each round and code it prints: p50/p95/p99 at one client, QPS at C clients, the
server's CPU per request (every thread, Linux /proc) and this client's own, and the
servers' stage p50s. The caller is the bench's (`--selectivity` of the corpus visible).

A checkout older than the data dir's formats cannot serve it: `--old-data-dir` gives it
a bench data dir of its own, written by its own `gateway bench` with the same `--chunks`
(the synthetic corpus and its questions do not depend on the code; the two manifests
must name the same size and seed). Both servers are asked the same questions, from this
code's client.

Usage: PYTHONPATH=. python scripts/measure_hot_path.py --data-dir D [--old-tree DIR
       [--old-data-dir D2]] [--also-env NAME=VALUE] [--rounds 3] [--queries 400]
       [--concurrency 8] [--selectivity 0.1] [--group-by chunk|document]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from pathlib import Path

from gateway.bench import synthetic
from gateway.bench.load import drive, percentiles
from gateway.bench.runner import MANIFEST
from gateway.bench.server import (
    add_also_env,
    also_env_settings,
    running_gateway,
    throwaway_issuer,
)


def measure(
    env: dict[str, str],
    token: str,
    questions: list[str],
    concurrency: int,
    body: dict[str, object] | None = None,
) -> dict[int, str]:
    """One server: half the questions from one client, the other half from `concurrency`
    (none finds its vector cached); a line each."""
    lines = {}
    with running_gateway(["serve", "--no-worker"], env) as served:
        drive(served.base, token, "/search", questions[:20], 1, body)  # warm
        half = 20 + (len(questions) - 20) // 2
        for clients, asked in ((1, questions[20:half]), (concurrency, questions[half:])):
            server_before, client_before = served.cpu_s(), sum(os.times()[:2])
            phase = drive(served.base, token, "/search", asked, clients, body)
            server_after, client_after = served.cpu_s(), sum(os.times()[:2])
            server_ms = (
                round((server_after - server_before) * 1000 / len(asked), 2)
                if server_before is not None and server_after is not None
                else None
            )
            client_ms = round((client_after - client_before) * 1000 / len(asked), 2)
            stages = {k: percentiles(v, (50,))["p50"] for k, v in phase.stages_ms.items()}
            lines[clients] = (
                f"{clients} clients: {percentiles(phase.latencies_ms)} QPS {phase.qps:.1f} "
                f"errors {phase.errors} {dict(phase.failures)}; "
                f"CPU per request: server {server_ms} ms, "
                f"client {client_ms} ms; stage p50s {stages}"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="a gateway bench data dir")
    parser.add_argument("--old-tree", help="also serve the code of this checkout")
    parser.add_argument(
        "--old-data-dir", type=Path, help="the bench data dir --old-tree serves (default: D)"
    )
    add_also_env(
        parser, "also serve this code with these settings (GATEWAY_LANE_CPUS=split); repeatable"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queries", type=int, default=400, help="per phase, none repeated")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--selectivity", type=float, default=0.1)
    parser.add_argument("--group-by", choices=["chunk", "document"], default="chunk")
    args = parser.parse_args()

    data = args.data_dir.resolve()
    manifest = json.loads((data / MANIFEST).read_text())
    pool = manifest["queries"]
    old_tree = str(Path(args.old_tree).resolve()) if args.old_tree else None  # before chdir
    old_data = args.old_data_dir.resolve() if args.old_data_dir is not None else None
    if old_data is not None:
        if old_tree is None:
            parser.error("--old-data-dir is the data dir of --old-tree")
        try:
            theirs = json.loads((old_data / MANIFEST).read_text())
        except (OSError, ValueError):
            parser.error(f"--old-data-dir: no bench manifest in {old_data}")
        if [theirs.get("recipe", {}).get(k) for k in ("source", "seed")] != [
            manifest["recipe"].get(k) for k in ("source", "seed")
        ]:
            parser.error("--old-data-dir holds another corpus (its size or seed differs)")
    work = Path(tempfile.mkdtemp(prefix="measure-hot-path-"))
    issuer = throwaway_issuer(work, data)
    token = issuer.token(
        synthetic.TENANT, synthetic.REGION, tuple(synthetic.caller_groups(args.selectivity))
    )
    codes = {"this code": dict(issuer.env)}
    if args.also_env:
        more = also_env_settings(args.also_env)
        codes[f"this code with {' '.join(args.also_env)}"] = {**issuer.env, **more}
    if old_tree is not None:
        os.chdir(work)  # so the working directory never shadows --old-tree
        old = {**issuer.env, "PYTHONPATH": old_tree}
        if old_data is not None:
            old["GATEWAY_DATA_DIR"] = str(old_data)
        codes[f"code of {args.old_tree}"] = old
    body = {"group_by": args.group_by} if args.group_by != "chunk" else None
    for round_ in range(args.rounds):
        questions = random.Random(round_).sample(pool, 2 * args.queries + 20)
        order = list(codes.items())
        for name, env in order if round_ % 2 == 0 else order[::-1]:
            for line in measure(env, token, questions, args.concurrency, body).values():
                print(f"round {round_ + 1}, {name}, {line}", flush=True)


if __name__ == "__main__":
    main()
