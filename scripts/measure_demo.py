"""Measure /answer and /search latency over real HTTP on the demo corpus.

Usage: python scripts/measure_demo.py [--rounds N] [--workdir DIR]
Starts `gateway demo` on a free loopback port with its own data dir, then asks each of the
demo's three callers the questions below, one request at a time, N rounds, and prints
p50/p95 per route with the abstention count. Every request carries a distinct ticket
number, so no request is served by the query-vector cache of an earlier one. Until
`gateway bench` exists (issue 7), this is the yardstick for answers.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from gateway.bench.server import running_gateway

QUESTIONS = (
    "How many days do customers have to return an item?",
    "What does rule MRC-7781 say?",
    "How long does standard delivery take?",
    "What discount do employees get?",
    "Do gift cards expire?",
    "What are the store opening hours on public holidays?",
    "How do I report a security incident?",
    "How long must a password be?",
    "Who approves an expense claim?",
    "What happens when a till is short at the end of the day?",
    "How many weeks of parental leave do employees get?",
    "When is a merchant payout held?",
    "What is the chargeback ratio that triggers a warning?",
    "Can I accept a gift from a supplier?",
    "What is the boiling point of liquid nitrogen?",
)


def read_tokens(env_file: Path) -> dict[str, str]:
    tokens = {}
    for line in env_file.read_text().splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        tokens[name] = shlex.split(value)[0]
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="measure-demo-"))
    data = work / "demo-data"
    with running_gateway(["demo", "--data-dir", str(data)]) as served:
        tokens = read_tokens(data / "demo.env")
        timings: dict[str, list[float]] = {"search": [], "answer": []}
        abstained = errors = ticket = 0
        with httpx.Client(base_url=served.base, timeout=30) as client:
            for _ in range(args.rounds):
                for token in tokens.values():
                    headers = {"Authorization": f"Bearer {token}"}
                    for question in QUESTIONS:
                        for route in ("search", "answer"):
                            ticket += 1
                            body = {"query": f"{question} (ticket {ticket})"}
                            started = time.perf_counter()
                            r = client.post(f"/{route}", json=body, headers=headers)
                            timings[route].append((time.perf_counter() - started) * 1000)
                            errors += r.status_code != 200
                            abstained += route == "answer" and bool(r.json().get("abstained"))
        for route, values in timings.items():
            qs = statistics.quantiles(values, n=100)
            print(
                f"/{route} over HTTP on the demo corpus, {len(values)} requests, 1 client: "
                f"p50 {qs[49]:.1f} ms, p95 {qs[94]:.1f} ms, max {max(values):.1f} ms"
            )
        print(f"abstained {abstained} of {len(timings['answer'])} answers; errors {errors}")


if __name__ == "__main__":
    main()
