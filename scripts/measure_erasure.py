"""Measure erasure (issue 31): how long erasing one document and 10% of a tenant takes, and
/search latency while an erasure runs against without (alternated).

The index is the synthetic bench corpus (`gateway/bench/synthetic.py`: tenant `bench`,
four chunks a document, vectors around real embeddings) at `--chunks` (default 20,000),
built once into `--data-dir` and copied for each run, so every erasure starts from the
same state.

1. `one`: delete one document, then time `erase` (the erasure generation and the retiring
   of every older one), `--rounds` times.
2. `tenth`: delete 10% of the tenant's documents as one generation, then time `erase`.
3. `search`: `gateway serve --no-worker` on a copy; one client sends /search queries
   (a caller seeing 10%) in windows of `--queries`: idle, then while `gateway erase
   --tenant bench --wait` runs after a delete of one document, alternating `--rounds`
   times; p50/p95 of each kind.

Usage: python scripts/measure_erasure.py [--chunks N] [--data-dir DIR] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from gateway.bench import synthetic
from gateway.bench.load import percentiles
from gateway.bench.server import gateway_command, running_gateway, throwaway_issuer
from gateway.domain import version_key
from gateway.ingest.erasure import erase
from gateway.ingest.pipeline import delete_versions, ingest_documents
from gateway.ingest.writer import ChangeSet, Plan, write_generation
from gateway.policy.model import Retrieval
from gateway.storage.catalog import Catalog
from gateway.storage.erasures import request_on
from gateway.storage.layout import DataLayout

ANN_MIN_ROWS = Retrieval().ann_min_rows


def build(root: Path, chunks: int) -> list[str]:
    """The synthetic corpus in `root` (once); its queries."""
    manifest = root / "measure-erasure.json"
    if manifest.exists():
        found: list[str] = json.loads(manifest.read_text())["queries"]
        return found
    from gateway.embedding import Embedder

    embedder = Embedder()
    base = synthetic.sentences(4000)
    vectors, tokens = synthetic.embed_sentences(embedder, base)
    layout = DataLayout(root)
    made = 0
    for batch in synthetic.batches(chunks, base, vectors, tokens, 100_000):
        made += len(batch.encoded.chunks)
        ingest_documents(
            batch.documents,
            layout,
            embedder,
            ann_min_rows=ANN_MIN_ROWS if made >= chunks else None,
            encoded=batch.encoded,
        )
    queries = [s.question for s in base]
    manifest.write_text(json.dumps({"queries": queries, "chunks": chunks}))
    return queries


def copy(source: Path, target: Path) -> DataLayout:
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    return DataLayout(target)


def tenant_docs(layout: DataLayout) -> list[str]:
    return sorted(d for d, _, _ in layout.open_catalog().visibilities(synthetic.TENANT))


def delete_share(layout: DataLayout, share: float) -> int:
    """Delete `share` of the bench tenant's documents as one generation; how many."""
    doomed = tenant_docs(layout)[:: int(1 / share)]

    def plan(_: Catalog) -> Plan:
        keys = frozenset(version_key(synthetic.TENANT, d, "1") for d in doomed)
        return Plan(ChangeSet(delete=keys))

    write_generation(
        layout, plan, within=lambda c, _, __: request_on(c, synthetic.TENANT, "delete")
    )
    return len(doomed)


def timed_erase(layout: DataLayout) -> dict[str, Any]:
    started = time.perf_counter()
    report = erase(layout, ann_min_rows=ANN_MIN_ROWS)
    assert report.done
    return {
        "seconds": round(time.perf_counter() - started, 2),
        "tenants_rewritten": report.tenants_rewritten,
        "files_removed": report.files_removed,
        "mb_removed": round(report.bytes_removed / 1e6, 1),
    }


def measure_one(source: Path, work: Path, rounds: int) -> None:
    for n in range(rounds):
        layout = copy(source, work / "one")
        delete_versions(layout, synthetic.TENANT, tenant_docs(layout)[n * 7])
        print("erase one document", n, timed_erase(layout), flush=True)


def measure_tenth(source: Path, work: Path, rounds: int) -> None:
    for n in range(rounds):
        layout = copy(source, work / "tenth")
        deleted = delete_share(layout, 0.1)
        print(f"erase 10% ({deleted} documents)", n, timed_erase(layout), flush=True)


def window(base: str, token: str, queries: list[str]) -> list[float]:
    latencies = []
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
        for query in queries:
            started = time.perf_counter()
            response = c.post("/search", json={"query": query})
            latencies.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, response.text
    return latencies


def measure_search(source: Path, work: Path, rounds: int, count: int, queries: list[str]) -> None:
    layout = copy(source, work / "served")
    (work / "issuer").mkdir(exist_ok=True)
    issuer = throwaway_issuer(work / "issuer", layout.root)
    token = issuer.token(synthetic.TENANT, synthetic.REGION, synthetic.caller_groups(0.1))
    idle: list[float] = []
    during: list[float] = []
    with running_gateway(["serve", "--no-worker"], issuer.env) as served:
        window(served.base, token, queries[:50])  # warm
        docs = tenant_docs(layout)
        at = 50
        for n in range(rounds):
            idle += window(served.base, token, queries[at : at + count])
            at += count
            delete_versions(layout, synthetic.TENANT, docs[n * 11])
            eraser = subprocess.Popen(
                [gateway_command(), "erase", "--tenant", synthetic.TENANT, "--wait"],
                env=issuer.env,
                stdout=subprocess.DEVNULL,
            )
            started = time.perf_counter()
            while eraser.poll() is None:
                during += window(served.base, token, queries[at : at + 10])
                at = (at + 10) % (len(queries) - 10)
            print(f"round {n}: erasure took {time.perf_counter() - started:.1f} s", flush=True)
    print("search idle", percentiles(idle), len(idle), "requests", flush=True)
    print("search during erasure", percentiles(during), len(during), "requests", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("what", nargs="*", default=["one", "tenth", "search"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        source = args.data_dir or work / "source"
        started = time.perf_counter()
        queries = build(source, args.chunks)
        print(f"corpus: {args.chunks} chunks ({time.perf_counter() - started:.0f} s)", flush=True)
        if "one" in args.what:
            measure_one(source, work, args.rounds)
        if "tenth" in args.what:
            measure_tenth(source, work, args.rounds)
        if "search" in args.what:
            measure_search(source, work, args.rounds, args.queries, queries)


if __name__ == "__main__":
    main()
