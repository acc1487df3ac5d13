"""Measure what the client doors cost over the routes they mirror (issue 29): MCP `search`
over `/search`, and `/v1/chat/completions` over `/answer`.

One `gateway serve` over the demo corpus (ingested into a temporary data dir), one client
with a kept-alive connection, each query through a door and the route it mirrors, one
after the other in an order that alternates from query to query (the query's embedding
cached beforehand, so both find it cached); p50 and p95 of each and the differences. The MCP call
is the POST an MCP client sends under the 2025-06-18 revision (no handshake: the server is
stateless), so what is measured is the door, not a client's extra round trips.

Usage: PYTHONPATH=. python scripts/measure_clients.py [--rounds 3] [--queries 25]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from gateway.bench.load import percentiles
from gateway.bench.server import gateway_command, running_gateway, throwaway_issuer

CORPUS = Path(__file__).resolve().parents[1] / "gateway" / "demo" / "corpus"
MCP_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2025-06-18",
}
WORDS = ["policy", "who approves", "how long", "retention", "refunds", "EU", "staff"]


def front_matter(path: Path) -> dict[str, str]:
    head = path.read_text().split("---")[1]
    return dict(line.split(": ", 1) for line in head.strip().splitlines() if ": " in line)


def corpus_caller() -> tuple[str, str, tuple[str, ...], list[str]]:
    """The demo corpus' one tenant, region EU, every group its ACLs name, and queries."""
    metas = [front_matter(p) for p in sorted(CORPUS.glob("*.md"))]
    groups = sorted({g for m in metas for g in re.findall(r'"group:([^"]+)"', m["acl"])})
    titles = [m["title"] for m in metas]
    queries = [f"{t} {WORDS[i % len(WORDS)]}" for i, t in enumerate(titles)]
    return metas[0]["tenant"], "EU", tuple(groups), queries


Door = Callable[[httpx.Client, str], httpx.Response]


def timed(door: Door, client: httpx.Client, query: str) -> float:
    started = time.perf_counter()
    response = door(client, query)
    elapsed = (time.perf_counter() - started) * 1000
    response.raise_for_status()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queries", type=int, default=25, help="per round")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="measure-clients-"))
    data = work / "data"
    subprocess.run(
        [gateway_command(), "ingest", str(CORPUS), "--data-dir", str(data)],
        check=True,
        capture_output=True,
    )
    issuer = throwaway_issuer(work, data)
    tenant, region, groups, queries = corpus_caller()
    token = issuer.token(tenant, region, groups)
    auth = {"Authorization": f"Bearer {token}"}

    def search(client: httpx.Client, q: str) -> httpx.Response:
        return client.post("/search", json={"query": q, "top_k": 10}, headers=auth)

    def mcp_search(client: httpx.Client, q: str) -> httpx.Response:
        call = {"name": "search", "arguments": {"query": q, "top_k": 10}}
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call}
        return client.post("/mcp", json=body, headers={**auth, **MCP_HEADERS})

    def answer(client: httpx.Client, q: str) -> httpx.Response:
        return client.post("/answer", json={"query": q}, headers=auth)

    def chat(client: httpx.Client, q: str) -> httpx.Response:
        body = {"model": "gateway", "messages": [{"role": "user", "content": q}]}
        return client.post("/v1/chat/completions", json=body, headers=auth)

    doors: dict[str, Door] = {
        "/search": search,
        "mcp search": mcp_search,
        "/answer": answer,
        "/v1 chat": chat,
    }
    latencies: dict[str, list[float]] = {name: [] for name in doors}
    with (
        running_gateway(["serve", "--no-worker"], issuer.env) as server,
        httpx.Client(base_url=server.base, timeout=60) as client,
    ):
        for door in doors.values():  # warm each path once
            timed(door, client, queries[0])
        for round_ in range(args.rounds):
            start = round_ * args.queries
            for i in range(args.queries):
                query = queries[(start + i) % len(queries)]
                # The query's embedding cached first (untimed), so that every door finds
                # it cached, and the pair's order alternates query by query.
                timed(search, client, query)
                for pair in (("/search", "mcp search"), ("/answer", "/v1 chat")):
                    for name in pair if (i + round_) % 2 == 0 else pair[::-1]:
                        latencies[name].append(timed(doors[name], client, query))
    stats = {name: percentiles(found, (50, 95)) for name, found in latencies.items()}
    for name, found in stats.items():
        count = len(latencies[name])
        print(f"{name:12} p50 {found['p50']:7.2f} ms  p95 {found['p95']:7.2f} ms  ({count})")
    for over, base in (("mcp search", "/search"), ("/v1 chat", "/answer")):
        print(
            f"{over} over {base}: p50 {stats[over]['p50'] - stats[base]['p50']:+.2f} ms, "
            f"p95 {stats[over]['p95'] - stats[base]['p95']:+.2f} ms"
        )


if __name__ == "__main__":
    main()
