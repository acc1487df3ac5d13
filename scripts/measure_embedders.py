"""Measure ingest with embedding workers apart from the committer (issue 32).

For N documents of real text (SQuAD 2.0 dev paragraphs, taken again under new IDs as
needed), queued as jobs of 100 in a fresh SQLite data dir: chunks/s from the first job
queued to the last one committed, with `gateway worker` alone and with `gateway worker`
plus K `gateway worker --embed-only` processes, alternated `--rounds` times. Every process
is started and has loaded its model before the jobs are queued, so start-up is not
counted. From each process's log line per slice it also prints the chunks each process
embedded and its chunks/s while embedding (its per-process cost, to project to more
hosts: on one host the processes share its cores).

Usage: python scripts/measure_embedders.py [--documents 300] [--embedders 2] [--rounds 2]
       [--slice-chunks 64] [--threads N] [--squad tests/data/squad2-dev-slice] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

from gateway.bench.server import gateway_command
from gateway.policy.loader import DEFAULT_POLICY_DIR
from gateway.storage.layout import DataLayout

ROOT = Path(__file__).resolve().parents[1]
LINE_WRITER = re.compile(r"writer embedded (\d+) chunks in ([\d.]+) s")
LINE_EMBEDDER = re.compile(r"embedded slice \S+ of job \S+: (\d+) chunks in ([\d.]+) s")


def documents(squad: Path, count: int) -> list[dict[str, Any]]:
    paragraphs = [json.loads(line) for line in (squad / "passages.jsonl").open()]
    return [
        {
            "doc_id": f"doc-{n}",
            "version": "1",
            "title": p["title"],
            "text": p["text"],
            "region": "EU",
            "acl": ["group:staff"],
            "effective_from": "2020-01-01",
        }
        for n, p in zip(range(count), itertools.cycle(paragraphs), strict=False)
    ]


def work(log: Path, pattern: re.Pattern[str]) -> tuple[int, float]:
    found = pattern.findall(log.read_text())
    return sum(int(c) for c, _ in found), sum(float(s) for _, s in found)


def policy_dir(workdir: Path, slice_chunks: int) -> Path:
    """The packaged policy with `ingest.slice_chunks` set (slices small enough to share)."""
    policy = yaml.safe_load((DEFAULT_POLICY_DIR / "policy.yaml").read_text())
    policy.setdefault("ingest", {})["slice_chunks"] = slice_chunks
    directory = workdir / "policy"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "policy.yaml").write_text(yaml.safe_dump(policy))
    return directory


def run(
    workdir: Path, records: list[dict[str, Any]], embedders: int, policy: Path, threads: int | None
) -> dict[str, Any]:
    root = workdir / f"data-{embedders}-{time.monotonic_ns()}"
    layout = DataLayout(root)
    catalog = layout.open_catalog()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "GATEWAY_DATA_DIR": str(root),
        "GATEWAY_POLICY_DIR": str(policy),
    }
    if threads:
        env["GATEWAY_EMBEDDING_THREADS"] = str(threads)
    logs = [root / f"embedder-{n}.log" for n in range(embedders)] + [root / "writer.log"]
    with ExitStack() as stack:
        processes = []
        for log in logs:
            out = stack.enter_context(log.open("wb"))
            args = ["--embed-only"] if log.name.startswith("embedder") else []
            processes.append(
                subprocess.Popen(
                    [gateway_command(), "worker", *args], env=env, stdout=out, stderr=out
                )
            )
        try:
            while not all(("ready" in log.read_text()) for log in logs):
                assert all(p.poll() is None for p in processes), "a worker exited"
                time.sleep(0.2)
            started = time.perf_counter()
            jobs = [
                catalog.jobs.submit("acme", "measure", records[n : n + 100], 1000).job_id
                for n in range(0, len(records), 100)
            ]
            while True:
                rows = [catalog.jobs.job("acme", j) for j in jobs]
                if all(r is not None and r.status in ("succeeded", "failed") for r in rows):
                    break
                time.sleep(0.1)
            seconds = time.perf_counter() - started
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=60)
    failed = [r for r in rows if r is not None and r.status != "succeeded"]
    assert not failed, [r.errors for r in failed]
    chunks = sum(r.chunks for r in rows if r is not None)
    per_process = [work(log, LINE_EMBEDDER) for log in logs[:-1]] + [work(logs[-1], LINE_WRITER)]
    return {"chunks": chunks, "seconds": seconds, "per_process": per_process}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=300)
    parser.add_argument("--embedders", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--slice-chunks", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="GATEWAY_EMBEDDING_THREADS")
    parser.add_argument("--squad", type=Path, default=ROOT / "tests" / "data" / "squad2-dev-slice")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="measure-embedders-"))
    records = documents(args.squad, args.documents)
    policy = policy_dir(workdir, args.slice_chunks)
    print(
        f"{args.documents} documents, slices of {args.slice_chunks} chunks, "
        f"torch threads {args.threads or 'default'}, "
        f"cores: {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}, workdir {workdir}"
    )
    for round_ in range(args.rounds):
        for embedders in (0, args.embedders):
            result = run(workdir, records, embedders, policy, args.threads)
            rate = result["chunks"] / result["seconds"]
            names = [f"embedder {n + 1}" for n in range(embedders)] + ["writer"]
            print(
                f"round {round_ + 1}, writer + {embedders} embedders: {result['chunks']} chunks "
                f"in {result['seconds']:.1f} s = {rate:.1f} chunks/s"
            )
            for name, (chunks, busy) in zip(names, result["per_process"], strict=True):
                each = chunks / busy if busy else 0.0
                print(
                    f"    {name}: {chunks} chunks embedded, {busy:.1f} s embedding, "
                    f"{each:.1f} chunks/s"
                )


if __name__ == "__main__":
    main()
