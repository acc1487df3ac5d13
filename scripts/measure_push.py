"""Measure the push API against real processes (issue 17's three figures).

1. `rate`: chunks/s of a push of N documents in batches of 100, from the first POST to the
   last document being found by /search (end to end), against `gateway ingest` of the same
   documents as JSONL (the CLI's own generation time). Runs alternate CLI, API, CLI, API.
2. `search`: /search latency from one client on a `gateway bench` data dir (default the
   200k synthetic one), idle and while a push of 1,000 documents is being written; with
   the number of degraded and failed requests.
3. `acl`: for T trials, revoke a reader's access with PUT .../acl and send the next
   /search at once: was it refused, and how long after the PUT answered.

Documents are SQuAD 2.0 dev paragraphs (`--squad`, default ../shared/data/squad2-dev;
the shipped slice with `--squad tests/data/squad2-dev-slice`), taken again as needed
under new IDs.

Usage: python scripts/measure_push.py rate|search|acl [--documents N] [--bench-dir DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from gateway.authn.apikeys import create_key
from gateway.bench import synthetic
from gateway.bench.load import percentiles
from gateway.bench.server import gateway_command, running_gateway, throwaway_issuer
from gateway.storage.layout import DataLayout

ROOT = Path(__file__).resolve().parents[1]
SQUAD = ROOT.parent / "shared" / "data" / "squad2-dev"


def documents(squad: Path, count: int, tenant: str, acl: list[str]) -> list[dict[str, Any]]:
    paragraphs = [json.loads(line) for line in (squad / "passages.jsonl").open()]
    return [
        {
            "doc_id": f"push-{n}",
            "title": p["title"],
            "text": p["text"],
            "tenant": tenant,
            "region": "EU",
            "acl": acl,
            "effective_from": "2020-01-01",
        }
        for n, p in zip(range(count), itertools.cycle(paragraphs), strict=False)
    ]


def seeded(work: Path, name: str) -> DataLayout:
    """A data dir holding one document, so a server is ready before the push."""
    layout = DataLayout(work / name)
    seed = work / f"{name}-seed.jsonl"
    doc = {"doc_id": "seed", "text": "Seed.", "tenant": "acme", "region": "EU"}
    seed.write_text(json.dumps({**doc, "acl": ["group:staff"], "effective_from": "2020-01-01"}))
    run([gateway_command(), "ingest", str(seed), "--data-dir", str(layout.root)])
    return layout


def run(command: list[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return result.stdout


def cli_rate(work: Path, docs: list[dict[str, Any]], n: int) -> dict[str, float]:
    layout = seeded(work, f"cli-{n}")
    path = work / f"cli-{n}.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in docs))
    out = run([gateway_command(), "ingest", str(path), "--data-dir", str(layout.root)])
    found = re.search(r"(\d+) chunks, .* ([\d.]+) s \(", out)
    assert found, out
    chunks, seconds = int(found.group(1)), float(found.group(2))
    return {"chunks": chunks, "seconds": seconds, "chunks_per_s": round(chunks / seconds, 1)}


def push(client: httpx.Client, docs: list[dict[str, Any]], batch: int = 100) -> list[str]:
    """POST every batch (202s), then wait for each job to succeed; the job IDs."""
    jobs = []
    for start in range(0, len(docs), batch):
        response = client.post("/admin/documents", json={"documents": docs[start : start + batch]})
        response.raise_for_status()
        jobs.append(response.json()["job_id"])
    for job_id in jobs:
        while (status := client.get(f"/admin/jobs/{job_id}").json()["status"]) in (
            "queued",
            "running",
        ):
            time.sleep(0.05)
        assert status == "succeeded", status
    return jobs


def api_rate(work: Path, docs: list[dict[str, Any]], n: int) -> dict[str, float]:
    layout = seeded(work, f"api-{n}")
    key, _ = create_key(
        layout.open_catalog(), tenant="acme", region="EU", principals=[], scope="ingest"
    )
    reader, _ = create_key(
        layout.open_catalog(), tenant="acme", region="EU", principals=["group:staff"]
    )
    (work / f"api-{n}-issuer").mkdir()
    issuer = throwaway_issuer(work / f"api-{n}-issuer", layout.root)
    with (
        running_gateway(["serve"], issuer.env) as served,
        httpx.Client(
            base_url=served.base, headers={"Authorization": f"Bearer {key}"}, timeout=600
        ) as client,
    ):
        push(client, docs[:1])  # the writer has loaded its model
        started = time.perf_counter()
        push(client, docs)
        last = docs[-1]["doc_id"]
        while (
            httpx.get(
                f"{served.base}/documents/{last}", headers={"Authorization": f"Bearer {reader}"}
            ).status_code
            != 200
        ):
            time.sleep(0.01)
        seconds = time.perf_counter() - started
    catalog = layout.open_catalog()
    chunks = sum(len(catalog.chunks_of("acme", d["doc_id"], "1")) for d in docs)
    generations = catalog.current_generation_id()
    return {
        "chunks": chunks,
        "seconds": round(seconds, 2),
        "chunks_per_s": round(chunks / seconds, 1),
        "generations": float(generations or 0),
    }


def measure_rate(args: argparse.Namespace) -> None:
    docs = documents(args.squad, args.documents, "acme", ["group:staff"])
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        for n in range(args.rounds):
            print("cli", n, cli_rate(work, docs, n), flush=True)
            print("api", n, api_rate(work, docs, n), flush=True)


def searches(
    base: str, token: str, queries: list[str], stop: threading.Event | None
) -> dict[str, Any]:
    """One client, one query after another: all of `queries`, or until `stop` is set."""
    latencies, degraded, failed = [], 0, 0
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
        for query in itertools.cycle(queries) if stop else queries:
            if stop is not None and stop.is_set():
                break
            started = time.perf_counter()
            response = c.post("/search", json={"query": query})
            latencies.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                failed += 1
            elif response.json().get("degraded"):
                degraded += 1
    return {
        "requests": len(latencies),
        **percentiles(latencies),
        "degraded": degraded,
        "failed": failed,
    }


def measure_search(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        layout = DataLayout(work / "data")
        shutil.copytree(args.bench_dir, layout.root)  # the push must not change the bench's
        queries = json.loads((layout.root / "bench" / "manifest.json").read_text())["queries"]
        (work / "issuer").mkdir()
        issuer = throwaway_issuer(work / "issuer", layout.root)
        token = issuer.token(synthetic.TENANT, synthetic.REGION, synthetic.caller_groups(0.1))
        key, _ = create_key(
            layout.open_catalog(),
            tenant=synthetic.TENANT,
            region="EU",
            principals=[],
            scope="ingest",
        )
        docs = documents(args.squad, args.documents, synthetic.TENANT, ["group:bench-0100"])
        with (
            running_gateway(["serve"], issuer.env) as served,
            httpx.Client(
                base_url=served.base, headers={"Authorization": f"Bearer {key}"}, timeout=600
            ) as client,
        ):
            searches(served.base, token, queries[:20], None)  # warm
            push(client, docs[:1])  # the writer is up
            idle = searches(served.base, token, queries[20:420], None)
            print("idle", idle, flush=True)
            stop = threading.Event()
            result: dict[str, Any] = {}
            load = threading.Thread(
                target=lambda: result.update(searches(served.base, token, queries[420:], stop))
            )
            started = time.perf_counter()
            load.start()
            push(client, docs[1:])
            push_s = time.perf_counter() - started
            stop.set()
            load.join()
            print(
                "during push",
                result,
                f"push of {len(docs) - 1} documents: {push_s:.1f} s",
                flush=True,
            )


def measure_acl(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        layout = seeded(work, "acl")
        catalog = layout.open_catalog()
        key, _ = create_key(catalog, tenant="acme", region="EU", principals=[], scope="ingest")
        reader, _ = create_key(catalog, tenant="acme", region="EU", principals=["group:staff"])
        (work / "issuer").mkdir()
        issuer = throwaway_issuer(work / "issuer", layout.root)
        refused_next, gaps = 0, []
        with running_gateway(["serve"], issuer.env) as served:
            admin = httpx.Client(base_url=served.base, headers={"Authorization": f"Bearer {key}"})
            user = httpx.Client(base_url=served.base, headers={"Authorization": f"Bearer {reader}"})
            for _ in range(args.trials):
                admin.put(
                    "/admin/documents/seed/acl", json={"acl": ["group:staff"]}
                ).raise_for_status()
                assert user.get("/documents/seed").status_code == 200
                admin.put(
                    "/admin/documents/seed/acl", json={"acl": ["group:board"]}
                ).raise_for_status()
                answered = time.perf_counter()
                found = user.post("/search", json={"query": "Seed"}).json()["results"]
                gaps.append((time.perf_counter() - answered) * 1000)
                refused_next += not any(r["doc_id"] == "seed" for r in found)
        print(
            f"acl: {refused_next}/{args.trials} next requests refused; next request answered "
            f"{percentiles(gaps)} ms after the PUT returned"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["rate", "search", "acl"])
    parser.add_argument("--documents", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--squad", type=Path, default=SQUAD)
    parser.add_argument(
        "--bench-dir", type=Path, default=Path("/tmp/gateway-bench/synthetic-200000")
    )
    args = parser.parse_args()
    if args.documents is None:
        args.documents = 2000 if args.what == "rate" else 1001
    {"rate": measure_rate, "search": measure_search, "acl": measure_acl}[args.what](args)


if __name__ == "__main__":
    main()
