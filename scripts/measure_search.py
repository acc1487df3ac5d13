"""Measure ingest rate and /search latency over real HTTP on the SQuAD 2.0 dev slice.

Usage: python scripts/measure_search.py [--queries N] [--workdir DIR]
Ingests ../shared/data/squad2-dev/passages.jsonl (601 paragraphs) with one tenant, region
and ACL, starts `gateway serve` on loopback with a throwaway issuer, sends the first N
answerable questions one at a time, and prints p50/p95 latency plus Recall@5/@10 of the
gold paragraph (by doc_id). Until `gateway bench` exists (issue 7), this is the yardstick.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from gateway.authn.devkeys import generate_signing_key, write_jwks

SQUAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad2-dev"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="measure-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "squad.jsonl"
    with corpus.open("w") as out:
        for line in (SQUAD / "passages.jsonl").open():
            p = json.loads(line)
            out.write(json.dumps({"doc_id": p["_id"], "title": p["title"], "text": p["text"],
                                  "tenant": "acme", "region": "EU", "acl": ["group:staff"],
                                  "effective_from": "2020-01-01"}) + "\n")
    exe = shutil.which("gateway", path=str(Path(sys.executable).parent)) or "gateway"
    data = work / "data"
    shutil.rmtree(data, ignore_errors=True)
    started = time.perf_counter()
    result = subprocess.run([exe, "ingest", str(corpus), "--data-dir", str(data)],
                            capture_output=True, text=True, check=True)
    print(result.stdout.strip(), f"(wall {time.perf_counter() - started:.1f} s incl. model load)")

    key = generate_signing_key("ES256", kid="measure")
    write_jwks(work / "jwks.json", key.public_jwks())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "GATEWAY_DATA_DIR": str(data), "GATEWAY_OIDC_ISSUER": "https://m",
           "GATEWAY_OIDC_AUDIENCE": "m", "GATEWAY_JWKS_URI": (work / "jwks.json").as_uri()}
    server = subprocess.Popen([exe, "serve", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if httpx.get(f"{base}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        now = int(time.time())
        token = key.sign({"iss": "https://m", "aud": "m", "sub": "u", "tenant": "acme",
                          "region": "EU", "groups": ["staff"], "exp": now + 3600})
        questions = [json.loads(line) for line in (SQUAD / "questions.jsonl").open()]
        answerable = [q for q in questions if not q["is_impossible"]][: args.queries]
        latencies, at5, at10, degraded = [], 0, 0, 0
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}) as c:
            for q in answerable:
                t = time.perf_counter()
                r = c.post("/search", json={"query": q["question"], "top_k": 10})
                latencies.append((time.perf_counter() - t) * 1000)
                body = r.json()
                ids = [x["doc_id"] for x in body["results"]]
                at5 += q["gold_passage_id"] in ids[:5]
                at10 += q["gold_passage_id"] in ids
                degraded += bool(body["degraded"])
        qs = statistics.quantiles(latencies, n=100)
        n = len(answerable)
        print(f"/search over HTTP, {n} queries, 1 client: p50 {qs[49]:.1f} ms, "
              f"p95 {qs[94]:.1f} ms, max {max(latencies):.1f} ms; degraded {degraded}")
        print(f"gold paragraph Recall@5 {at5 / n:.3f}, Recall@10 {at10 / n:.3f}")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
