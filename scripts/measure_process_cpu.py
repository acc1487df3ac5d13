"""Measure the CPU each process spends while a command runs: every process's own user and
system time (not its children's), read from /proc every `--every` seconds and summed by
kind (`gateway serve`, `gateway worker`, `pytest worker`, ...). Every process of the
machine counts, so measure on a quiet one. A process that starts and
ends between two samples is missed, and one's last moments before it ends are not seen:
the totals are slightly low. Linux only.

With `--ready URL` the command is stopped once URL answers 200, and a gateway's `/readyz`
also says every process of a `--processes N` group started (a server's start to ready:
`-- gateway serve --no-worker` with `--ready http://127.0.0.1:8080/readyz`).

How the CPU of `make test` was apportioned, and what a process start costs (CHANGELOG,
issue 27).

Usage: python scripts/measure_process_cpu.py [--every 0.25] [--ready URL] -- COMMAND ...
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import time
from pathlib import Path

import httpx

from gateway.bench.server import gateway_ready

TICKS = os.sysconf("SC_CLK_TCK")
GATEWAY_COMMANDS = frozenset((
    "serve", "worker", "sync", "erase", "tenant", "ingest", "db", "keys", "reindex", "bench",
    "demo", "acl", "delete", "policy", "audit", "eval",
))  # fmt: skip


def kind_of(argv: list[str]) -> str:
    """What a process is, from its command line."""
    words = [Path(a).name if i == 0 else a for i, a in enumerate(argv)]
    line = " ".join(words)
    for i, word in enumerate(words):
        if word == "gateway" or word.endswith("/gateway"):
            following = words[i + 1 : i + 2]
            if following and following[0] in GATEWAY_COMMANDS:
                embed_only = " --embed-only" if "--embed-only" in words else ""
                return f"gateway {following[0]}{embed_only}"
    if "exec(eval(sys.stdin" in line:  # how pytest-xdist starts its workers
        return "pytest worker"
    if "pytest" in words[:3] or any(w.endswith("/pytest") for w in words[:2]):
        return "pytest"
    name = words[0] if words else "?"
    if name.startswith("python") and len(words) > 1:
        module = words[2] if words[1] == "-m" and len(words) > 2 else Path(words[1]).name
        return f"python {module}"
    return name


def sample(seen: dict[tuple[int, int], tuple[str, float]]) -> None:
    """Each live process's CPU so far, keyed by (pid, start time): a reused pid is another."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        words = [a.decode(errors="replace") for a in argv if a]
        if not words:
            continue  # a kernel thread
        key = (int(entry), int(stat[19]))
        cpu = (int(stat[11]) + int(stat[12])) / TICKS  # utime + stime, own only
        kind = seen[key][0] if key in seen else kind_of(words)
        seen[key] = (kind, cpu)


def ready(url: str) -> bool:
    try:
        response = httpx.get(url, timeout=1)
    except httpx.HTTPError:
        return False
    if url.rstrip("/").endswith("/readyz"):  # a gateway's: ready once all its processes are
        return gateway_ready(response)
    return response.status_code == 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=0.25, help="seconds between samples")
    parser.add_argument("--ready", help="stop the command once this URL answers 200")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    options = parser.parse_args()
    command = options.command[1:] if options.command[:1] == ["--"] else options.command
    if not command:
        parser.error("give the command to measure after --")

    before: dict[tuple[int, int], tuple[str, float]] = {}
    sample(before)  # what already ran is not the command's
    seen = dict(before)
    started = time.monotonic()
    process = subprocess.Popen(command)
    while process.poll() is None:
        time.sleep(options.every)
        sample(seen)
        if options.ready and ready(options.ready):
            sample(seen)
            process.terminate()
            process.wait(timeout=60)
            break
    wall = time.monotonic() - started

    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for key, (kind, cpu) in seen.items():
        spent = cpu - before[key][1] if key in before else cpu
        if spent > 0:
            totals[kind][0] += 1
            totals[kind][1] += spent
    print(f"{'kind':32} {'processes':>9} {'CPU s':>9} {'each':>7}")
    for kind, (count, cpu) in sorted(totals.items(), key=lambda item: -item[1][1]):
        print(f"{kind:32} {int(count):9d} {cpu:9.1f} {cpu / count:7.2f}")
    total = sum(cpu for _, cpu in totals.values())
    print(f"total {total:.1f} CPU s in {wall:.1f} s; the command exited {process.returncode}")


if __name__ == "__main__":
    main()
