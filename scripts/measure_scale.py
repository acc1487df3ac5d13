"""Measure the scale-out topology against the embedded default (issue 18's figures).

Starts a throwaway PostgreSQL cluster and a SeaweedFS store on loopback (the fixtures of
`tests/helpers/postgres.py` and `tests/helpers/seaweed.py`), ingests the same corpus twice
(the embedded default: SQLite and the index in one data dir; and PostgreSQL with the index
on S3), and runs real `gateway serve` processes:

1. `/search` latency from one client, embedded vs one replica on PostgreSQL + S3, in
   alternated batches (both servers up, one driven at a time);
2. freshness: 20 single-document pushes to replica 1 (no wait): time from the job's
   success to replica 2 serving the document; and revocation: after `PUT …/acl` on
   replica 1 returns, is replica 2's next request refused;
3. throughput: four client threads against one replica, then against two (on a two-core
   machine this shows the overhead of a second process, not scaling), with each server
   process's CPU time per request.

Corpus and queries: SQuAD 2.0 dev (`--squad`, default ../shared/data/squad2-dev).
Usage: PYTHONPATH=. python scripts/measure_scale.py [--queries 300]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from gateway.authn.apikeys import create_key
from gateway.bench.load import drive, percentiles
from gateway.bench.server import (
    RunningGateway,
    cpu_s,
    gateway_command,
    running_gateway,
    throwaway_issuer,
)
from gateway.storage.layout import DataLayout
from tests.helpers.postgres import throwaway_cluster
from tests.helpers.seaweed import throwaway_store

SQUAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad2-dev"
VISIBILITY = {
    "tenant": "acme",
    "region": "EU",
    "acl": ["group:staff"],
    "effective_from": "2020-01-01",
}


@contextmanager
def served(env: dict[str, str]) -> Iterator[RunningGateway]:
    with running_gateway(["serve", "--no-worker"], env) as gateway:
        yield gateway


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--squad", type=Path, default=SQUAD)
    parser.add_argument("--queries", type=int, default=300)
    args = parser.parse_args()
    passages = [json.loads(line) for line in (args.squad / "passages.jsonl").open()]
    questions = [json.loads(line)["question"] for line in (args.squad / "questions.jsonl").open()]
    queries = questions[: args.queries]

    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        cluster = stack.enter_context(throwaway_cluster())
        store = stack.enter_context(throwaway_store())
        corpus = work / "corpus.jsonl"
        corpus.write_text(
            "\n".join(
                json.dumps(
                    {"doc_id": p["_id"], "title": p["title"], "text": p["text"], **VISIBILITY}
                )
                for p in passages
            )
        )
        (work / "issuer").mkdir()
        issuer = throwaway_issuer(work / "issuer", work / "embedded")
        token = issuer.token()
        scale = {
            **issuer.env,
            "GATEWAY_DATABASE_URL": cluster.new_database(),
            "GATEWAY_INDEX_URI": store.new_prefix(),
            **store.env(),
        }

        def env(data: str, base: dict[str, str]) -> dict[str, str]:
            return {**base, "GATEWAY_DATA_DIR": str(work / data)}

        for data, base in (("embedded", issuer.env), ("writer", scale)):
            subprocess.run(
                [gateway_command(), "ingest", str(corpus)],
                env=env(data, base),
                check=True,
                capture_output=True,
            )
        layout = DataLayout(work / "writer", scale["GATEWAY_DATABASE_URL"])
        catalog = layout.open_catalog()
        key, _ = create_key(catalog, tenant="acme", region="EU", principals=[], scope="ingest")
        print(f"corpus: {len(passages)} passages; queries: {len(queries)}", flush=True)

        embedded = stack.enter_context(served(env("embedded", issuer.env)))
        one = stack.enter_context(served(env("replica-1", scale)))
        for gateway in (embedded, one):
            drive(gateway.base, token, "/search", queries[:20], 1)  # warm
        latencies: dict[str, list[float]] = {"embedded": [], "replica": []}
        for round_ in range(2):
            for name, gateway in (("embedded", embedded), ("replica", one)):
                phase = drive(gateway.base, token, "/search", queries, 1)
                latencies[name] += phase.latencies_ms
                seen = percentiles(phase.latencies_ms)
                failed = f"errors {phase.errors} {dict(phase.failures)}"
                print(f"round {round_} {name}: {seen} {failed}", flush=True)
                print(f"  degraded {phase.degraded}", flush=True)
        for name, values in latencies.items():
            print(f"search {name}: {percentiles(values)} over {len(values)}", flush=True)

        two = stack.enter_context(served(env("replica-2", scale)))
        writer = subprocess.Popen(
            [gateway_command(), "worker"],
            env=env("writer", scale),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        stack.callback(writer.terminate)
        freshness_ms: list[float] = []
        refused = 0
        ingest = {"Authorization": f"Bearer {key}"}
        staff = {"Authorization": f"Bearer {token}"}

        def found(client: httpx.Client, base: str, query: str) -> set[str]:
            response = client.post(f"{base}/search", json={"query": query}, headers=staff)
            return {r["doc_id"] for r in response.json()["results"]}

        with httpx.Client(timeout=120) as client:
            for n in range(21):
                doc = {
                    "doc_id": f"fresh-{n}",
                    "text": f"Fresh note {n} about pelicans, filed as FRX-{n}.",
                    **VISIBILITY,
                }
                doc.pop("tenant")
                job = client.post(
                    f"{one.base}/admin/documents", json={"documents": [doc]}, headers=ingest
                ).json()
                while (
                    status := client.get(
                        f"{one.base}/admin/jobs/{job['job_id']}", headers=ingest
                    ).json()
                )["status"] != "succeeded":
                    assert status["status"] in ("queued", "running"), status
                    time.sleep(0.005)
                succeeded = time.perf_counter()
                while f"fresh-{n}" not in found(client, two.base, f"FRX-{n}"):  # by search
                    time.sleep(0.002)
                if n:  # the first push waited for the writer's model to load
                    freshness_ms.append((time.perf_counter() - succeeded) * 1000)
                revoke = client.put(
                    f"{one.base}/admin/documents/fresh-{n}/acl",
                    json={"acl": ["group:board"]},
                    headers=ingest,
                )
                revoke.raise_for_status()
                refused += f"fresh-{n}" not in found(client, two.base, f"FRX-{n}")
        fresh = percentiles(freshness_ms, (50, 100))
        print(f"freshness (job succeeded -> served on the other replica): {fresh} ms", flush=True)
        print(f"revocation: the other replica's next request refused in {refused}/21", flush=True)

        def throughput(gateways: list[RunningGateway]) -> dict[str, Any]:
            before = {g.pid: cpu_s(g.pid) for g in gateways}
            done: list[int] = []
            started = time.perf_counter()

            def client(base: str, share: list[str]) -> None:
                phase = drive(base, token, "/search", share, 1)
                done.append(len(phase.latencies_ms) - phase.errors)

            threads = [
                threading.Thread(
                    target=client, args=(gateways[i % len(gateways)].base, queries[i::4])
                )
                for i in range(4)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.perf_counter() - started
            cpu = sum(cpu_s(g.pid) - before[g.pid] for g in gateways)
            return {
                "qps": round(sum(done) / wall, 1),
                "server_cpu_ms_per_request": round(cpu * 1000 / sum(done), 2),
            }

        for round_ in range(2):
            print(
                f"round {round_} throughput, 4 clients, one replica: {throughput([one])}",
                flush=True,
            )
            print(
                f"round {round_} throughput, 4 clients, two replicas: {throughput([one, two])}",
                flush=True,
            )


if __name__ == "__main__":
    main()
