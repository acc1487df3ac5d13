"""Measure POST /answer over real HTTP: extractive p50/p95, and with an LLM endpoint the time
to the first answer token (streamed) and to the final event.

Usage: python scripts/measure_answer.py [--queries N] [--workdir DIR] [--llm-base-url URL
       --llm-model NAME]
Ingests the SQuAD 2.0 dev slice as scripts/measure_search.py does (reusing its index when
--workdir holds one), starts `gateway serve` with a throwaway issuer and asks the first N
answerable questions one at a time. For a local LLM endpoint, e.g. llama.cpp's server:
python -m llama_cpp.server --model <gguf> --host 127.0.0.1 --port 8765 --n_ctx 2048
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from gateway.bench.server import gateway_command, running_gateway, throwaway_issuer

SQUAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "squad2-dev"


def quantiles(values: list[float]) -> str:
    qs = statistics.quantiles(values, n=100)
    return f"p50 {qs[49]:.0f} ms, p95 {qs[94]:.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--llm-base-url", default="")
    parser.add_argument("--llm-model", default="local")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="measure-answer-"))
    data = work / "data"
    if not (data / "catalog.db").exists():
        corpus = work / "squad.jsonl"
        with corpus.open("w") as out:
            for line in (SQUAD / "passages.jsonl").open():
                p = json.loads(line)
                record = {"doc_id": p["_id"], "title": p["title"], "text": p["text"]}
                scope = {"tenant": "acme", "region": "EU", "acl": ["group:staff"]}
                out.write(json.dumps({**record, **scope, "effective_from": "2020-01-01"}) + "\n")
        subprocess.run(
            [gateway_command(), "ingest", str(corpus), "--data-dir", str(data)], check=True
        )
    issuer = throwaway_issuer(work, data)
    env = issuer.env
    if args.llm_base_url:
        env |= {"GATEWAY_LLM_BASE_URL": args.llm_base_url, "GATEWAY_LLM_MODEL": args.llm_model}
    questions = [json.loads(line) for line in (SQUAD / "questions.jsonl").open()]
    asked = [q["question"] for q in questions if not q["is_impossible"]][: args.queries]
    headers = {"Authorization": f"Bearer {issuer.token()}"}
    with (
        running_gateway(["serve"], env) as served,
        httpx.Client(base_url=served.base, timeout=120) as c,
    ):
        whole, first, outcomes = [], [], {"answered": 0, "abstained": 0, "degraded": 0}
        for question in asked:
            started = time.perf_counter()
            first_token = None
            body = {"query": question, "stream": bool(args.llm_base_url)}
            with c.stream("POST", "/answer", json=body, headers=headers) as response:
                assert response.status_code == 200, response.read()
                final = None
                if args.llm_base_url:
                    for line in response.iter_lines():
                        if line == "event: token" and first_token is None:
                            first_token = time.perf_counter() - started
                        if line.startswith("data: "):
                            final = json.loads(line.removeprefix("data: "))
                else:
                    final = json.loads(response.read())
            whole.append((time.perf_counter() - started) * 1000)
            if first_token is not None:
                first.append(first_token * 1000)
            assert final is not None
            outcomes["abstained" if final["abstained"] else "answered"] += 1
            outcomes["degraded"] += bool(final["degraded"])
    mode = f"LLM {args.llm_model}" if args.llm_base_url else "extractive"
    print(f"/answer ({mode}), {len(asked)} questions, 1 client: whole answer {quantiles(whole)}")
    if first:
        print(f"time to first answer token: {quantiles(first)} ({len(first)} streams)")
    print(", ".join(f"{k} {v}" for k, v in outcomes.items()))


if __name__ == "__main__":
    main()
