"""Measure /search with 5,000 principals per caller, over real HTTP, against a baseline.

Usage: python scripts/measure_principals.py [--queries N] [--workdir DIR]
Ingests the SQuAD 2.0 dev paragraphs with each document's ACL naming nine of 5,000 team
groups (round robin, so every team is named somewhere), and serves them with a policy
whose nested groups give callers 5,000 principals from a token naming one group. Three
callers ask questions of their own (so none profits from another's cached query
vectors): `baseline` (one team: 2 principals), `sparse` (5,000 groups of which one is
named by any ACL: the common case) and `dense` (member of all 5,000 teams, every one named
by some ACL: the worst case). Prints p50/p95 per caller and how much each may see.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from gateway.authn.devkeys import generate_signing_key, write_jwks
from gateway.bench.server import gateway_command, running_gateway

SQUAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad2-dev"
TEAMS = 5000


def write_corpus(path: Path) -> None:
    with path.open("w") as out:
        for n, line in enumerate((SQUAD / "passages.jsonl").open()):
            p = json.loads(line)
            record = {
                "doc_id": p["_id"],
                "title": p["title"],
                "text": p["text"],
                "tenant": "acme",
                "region": "EU",
                "acl": [f"group:team-{(n * 9 + k) % TEAMS}" for k in range(9)],
                "effective_from": "2020-01-01",
            }
            out.write(json.dumps(record) + "\n")


def write_policy(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    policy = {
        "nested_groups": {
            "all-teams": [f"team-{i}" for i in range(TEAMS)],
            "many-unused": [f"unused-{i}" for i in range(TEAMS - 1)] + ["team-0"],
        }
    }
    (directory / "policy.yaml").write_text(yaml.safe_dump(policy))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="measure-principals-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "data"
    if not (data / "catalog.db").exists():
        write_corpus(work / "corpus.jsonl")
        subprocess.run(
            [gateway_command(), "ingest", str(work / "corpus.jsonl"), "--data-dir", str(data)],
            check=True,
            capture_output=True,
        )
    write_policy(work / "policy")
    key = generate_signing_key("ES256", kid="measure")
    write_jwks(work / "jwks.json", key.public_jwks())
    env = {
        **os.environ,
        "GATEWAY_DATA_DIR": str(data),
        "GATEWAY_POLICY_DIR": str(work / "policy"),
        "GATEWAY_OIDC_ISSUER": "https://m",
        "GATEWAY_OIDC_AUDIENCE": "m",
        "GATEWAY_JWKS_URI": (work / "jwks.json").as_uri(),
    }
    callers = {"baseline": ["team-0"], "sparse": ["many-unused"], "dense": ["all-teams"]}
    questions = [json.loads(line)["question"] for line in (SQUAD / "questions.jsonl").open()]
    with (
        running_gateway(["serve"], env) as served,
        httpx.Client(base_url=served.base, timeout=60) as c,
    ):
        for turn, (name, groups) in enumerate(callers.items()):
            claims = {
                "iss": "https://m",
                "aud": "m",
                "sub": name,
                "tenant": "acme",
                "region": "EU",
                "groups": groups,
                "exp": int(time.time()) + 3600,
            }
            headers = {"Authorization": f"Bearer {key.sign(claims)}"}
            visible = c.post("/search", json={"query": "the", "top_k": 100}, headers=headers)
            latencies = []
            for question in questions[turn * args.queries : (turn + 1) * args.queries]:
                started = time.perf_counter()
                r = c.post("/search", json={"query": question}, headers=headers)
                latencies.append((time.perf_counter() - started) * 1000)
                assert r.status_code == 200, r.text
            qs = statistics.quantiles(latencies, n=100)
            print(
                f"{name:8} groups {groups[0]:12} sees {len(visible.json()['results']):3} "
                f"(top 100): /search p50 {qs[49]:.1f} ms, p95 {qs[94]:.1f} ms"
            )


if __name__ == "__main__":
    main()
