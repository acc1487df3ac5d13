"""Measure what ranking whole documents costs `/search` (issue 21): `group_by: "document"`,
`top_k` 100, one client, over HTTP, one server per way of ranking documents, all up at once
and driven in alternated batches (these machines drift by 10% or more between minutes).

On any data dir the current code wrote (a generation written by an earlier release has no
whole-document index until its next write):

- the 200k bench (`gateway bench --chunks 200000 --data-dir D` leaves one; its caller sees
  10%): `--bench`;
- a `gateway eval` data dir, e.g. the SQuAD slice's: `--tenant eval --region EVAL
  --group eval --questions ../shared/data/squad2-dev/questions.jsonl`.

With `--added`, half of each batch is asked by chunk instead: slices of PAIRED_SLICE
questions, one by chunk, the next by document, which way first alternating. Each
server's line then adds the percentiles by chunk, and what ranking documents adds: the
difference of the two p50s and of the two means (`--top-k 10`: the bench's default
request). No question is asked both ways: the second asking would find its query's
vector cached and skip the embedding.

With `--old-tree`, a checkout older than the data dir's formats cannot serve it:
`--old-data-dir` gives it one of its own, the same corpus ingested by that checkout
(`PYTHONPATH=OLD python -m gateway eval --corpus ... --data-dir D2`).

Usage: PYTHONPATH=. python scripts/measure_document_ranking.py --data-dir D --bench
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from contextlib import ExitStack
from pathlib import Path

import httpx
import yaml

from gateway.bench import synthetic
from gateway.bench.load import drive, percentiles
from gateway.bench.server import (
    add_also_env,
    also_env_settings,
    running_gateway,
    throwaway_issuer,
)
from gateway.evaluation.retrieval import EARLIER_DEFAULT
from gateway.policy.loader import DEFAULT_POLICY_DIR

# Each way of ranking documents, as the policy changes it.
MODES: dict[str, dict[str, object]] = {
    "default": {},
    "earlier default (best chunks, RRF)": EARLIER_DEFAULT,
    "document_vector mean": {"document_vector": "mean"},
    "no document_bm25": {"document_bm25": False},
}
PAIRED_SLICE = 20  # questions asked one way, then the other, within a second or so
BENCH_QUESTIONS = [
    f"how must the {team} team {verb} a {thing}"
    for team in ("payroll", "legal", "security", "finance", "support")
    for verb in ("archive", "approve", "review", "encrypt")
    for thing in ("invoice", "contract", "laptop", "badge", "timesheet")
]


def policy_dir(root: Path, change: dict[str, object]) -> Path:
    policy = yaml.safe_load((DEFAULT_POLICY_DIR / "policy.yaml").read_text())
    policy.setdefault("retrieval", {}).update(change)
    root.mkdir(parents=True)
    (root / "policy.yaml").write_text(yaml.safe_dump(policy))
    return root


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--bench", action="store_true", help="the bench's caller and questions")
    parser.add_argument("--tenant", default="eval")
    parser.add_argument("--region", default="EVAL")
    parser.add_argument("--group", action="append", default=[], help="a groups claim")
    parser.add_argument("--questions", type=Path, help="JSONL with `question` or `text`")
    parser.add_argument("--modes", nargs="*", default=list(MODES)[:2], choices=list(MODES))
    parser.add_argument(
        "--old-tree", help="also serve with the code of this checkout, its default policy"
    )
    parser.add_argument(
        "--old-data-dir",
        type=Path,
        help="the data dir --old-tree serves (default: the same), the same corpus ingested by it",
    )
    add_also_env(
        parser, "also serve the default policy with these settings (GATEWAY_LANE_CPUS=split)"
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--top-k", type=int, default=100, help="the requests' top_k")
    parser.add_argument(
        "--added", action="store_true", help="also by chunk: what ranking documents adds"
    )
    parser.add_argument("--queries", type=int, default=100, help="per batch")
    args = parser.parse_args()
    if args.old_data_dir is not None and not args.old_tree:
        parser.error("--old-data-dir is the data dir of --old-tree")
    # Resolved before the run changes directory (so that no working directory shadows --old-tree).
    args.data_dir = args.data_dir.resolve()
    old_data = args.old_data_dir.resolve() if args.old_data_dir is not None else None

    if args.bench:
        tenant, region = synthetic.TENANT, synthetic.REGION
        groups = tuple(synthetic.caller_groups(0.1))
        pool = [q + f" ticket {i}" for i, q in enumerate(BENCH_QUESTIONS * 400)]
    else:
        tenant, region, groups = args.tenant, args.region, tuple(args.group or ["eval"])
        if args.questions is None:
            parser.error("--questions is needed without --bench")
        lines = args.questions.read_text().splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
        pool = [str(r.get("question") or r.get("text")) for r in rows]
    needed = 20 + args.rounds * args.queries
    questions = (pool * (needed // len(pool) + 1))[:needed]

    work = Path(tempfile.mkdtemp(prefix="measure-document-ranking-"))
    issuer = throwaway_issuer(work, args.data_dir)
    token = issuer.token(tenant, region, groups)
    body = {"top_k": args.top_k, "group_by": "document"}
    latencies: dict[str, list[float]] = {mode: [] for mode in args.modes}
    by_chunk: dict[str, list[float]] = {mode: [] for mode in args.modes}
    with_servers = []
    for mode in args.modes:
        policy = policy_dir(work / f"policy-{len(with_servers)}", MODES[mode])
        env = {**issuer.env, "GATEWAY_POLICY_DIR": str(policy)}
        with_servers.append((mode, running_gateway(["serve", "--no-worker"], env)))
    if args.also_env:
        varied = f"default with {' '.join(args.also_env)}"
        latencies[varied], by_chunk[varied] = [], []
        env = {**issuer.env, **also_env_settings(args.also_env)}
        with_servers.append((varied, running_gateway(["serve", "--no-worker"], env)))
    if args.old_tree:
        os.chdir(work)  # so the working directory never shadows --old-tree
        env = {**issuer.env, "PYTHONPATH": args.old_tree}
        env.pop("GATEWAY_POLICY_DIR", None)
        if args.old_data_dir is not None:
            env["GATEWAY_DATA_DIR"] = str(old_data)
        old = f"code of {args.old_tree}"
        latencies[old], by_chunk[old] = [], []
        with_servers.append((old, running_gateway(["serve", "--no-worker"], env)))
    servers = {}
    # Only the servers that started are stopped: a server that fails to start ends the
    # run with its own error, and starts no other on the way out.
    with ExitStack() as started:
        for mode, context in with_servers:
            servers[mode] = started.enter_context(context)
            # Warm: the query-vector cache, the permitted rows, the document sums.
            drive(servers[mode].base, token, "/search", questions[:20], 1, body)
            found = httpx.post(
                f"{servers[mode].base}/search",
                json={"query": questions[0], **body},
                headers={"Authorization": f"Bearer {token}"},
            ).json()["results"]
            if not found:
                raise SystemExit(f"{mode}: no results: is the caller allowed any document?")
        at = 20
        for round_ in range(args.rounds):
            batch = questions[at : at + args.queries]
            at += args.queries
            order = list(servers.items())
            for mode, server in order if round_ % 2 == 0 else order[::-1]:
                if not args.added:
                    latencies[mode] += asked(server.base, token, batch, body, mode)
                    continue
                for n, at_slice in enumerate(range(0, len(batch), 2 * PAIRED_SLICE)):
                    ways = [(by_chunk, {"top_k": args.top_k}), (latencies, body)]
                    for half, (into, asked_with) in enumerate(
                        ways if (round_ + n) % 2 == 0 else ways[::-1]
                    ):
                        start = at_slice + half * PAIRED_SLICE
                        part = batch[start : start + PAIRED_SLICE]
                        into[mode] += asked(server.base, token, part, asked_with, mode)
    for mode, found in latencies.items():
        print(
            f"/search by document, top_k {args.top_k}, {mode}: {percentiles(found)} ({len(found)})"
        )
        if args.added:
            chunks = by_chunk[mode]
            p50 = percentiles(found, (50,))["p50"] - percentiles(chunks, (50,))["p50"]
            mean = sum(found) / len(found) - sum(chunks) / len(chunks)
            print(
                f"  by chunk: {percentiles(chunks)} ({len(chunks)}); "
                f"by document adds {p50:.2f} ms at p50, {mean:.2f} ms on average"
            )


def asked(
    base: str, token: str, questions: list[str], body: dict[str, object], mode: str
) -> list[float]:
    """Each question's latency, asked once in order from one client."""
    phase = drive(base, token, "/search", questions, 1, body)
    if phase.errors:
        raise SystemExit(f"{mode}: {phase.errors} errors: {dict(phase.failures)}")
    return phase.latencies_ms


if __name__ == "__main__":
    main()
