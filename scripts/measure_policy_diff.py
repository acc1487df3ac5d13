"""Measure `gateway policy diff` on a large catalog with a large policy (issue 20).

On a `gateway bench` data dir (e.g. `gateway bench --chunks 200000 --data-dir D`), a base
policy of `--groups` team groups, each nested in one of the bench's 40 departments and
one of its ladder groups (every 50th with a grant), against an edit that nests ten teams
in the widest ladder group and drops one department's nesting: the time of the command
end to end (a process: imports, catalog read, diff, table), and of its parts in process.

Usage: PYTHONPATH=. python scripts/measure_policy_diff.py --data-dir D [--groups 5000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from gateway.bench import synthetic
from gateway.policy.diff import diff_policies
from gateway.policy.loader import load_policy
from gateway.storage.layout import DataLayout


def policy(groups: int, widened: bool) -> dict[str, Any]:
    ladder = [synthetic.caller_groups(share)[-1] for share in synthetic.LADDER]
    nested = {
        f"team-{i}": [f"dept-{i % 40}", ladder[i % 4]]  # the narrow rungs only
        for i in range(groups)
    }
    if widened:
        for i in range(10):
            nested[f"team-{i}"].append(ladder[-1])  # everything in force
        nested["team-11"] = [ladder[11 % 4]]  # no longer in dept-11
    grants = [{"group": f"team-{i}", "grants": [f"support:{i % 7}"]} for i in range(0, groups, 50)]
    return {"nested_groups": nested, "grants": grants}


def write(directory: Path, content: dict[str, Any]) -> Path:
    directory.mkdir()
    (directory / "policy.yaml").write_text(yaml.safe_dump(content))
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--groups", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="measure-policy-diff-"))
    base = write(work / "base", policy(args.groups, widened=False))
    new = write(work / "new", policy(args.groups, widened=True))

    command = [sys.executable, "-m", "gateway", "policy", "diff", str(base), str(new)]
    command += ["--data-dir", str(args.data_dir), "--json"]
    ends = []
    for _ in range(args.runs):
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        ends.append(time.perf_counter() - started)
    print(f"gateway policy diff, end to end: median {statistics.median(ends):.2f} s {ends}")
    print(f"  ({len(done.stdout) / 1e6:.1f} MB of JSON)")

    started = time.perf_counter()
    loaded = load_policy(base), load_policy(new)
    loading = time.perf_counter() - started
    started = time.perf_counter()
    versions = DataLayout(args.data_dir).open_catalog().visibilities()
    reading = time.perf_counter() - started
    started = time.perf_counter()
    diff = diff_policies(*loaded, versions, dt.datetime.now(dt.UTC).date())
    diffing = time.perf_counter() - started
    gained = {d for c in diff.changes for d in c.gains}
    lost = {d for c in diff.changes for d in c.losses}
    print(
        f"in process: load both policies {loading:.2f} s, read {len(versions)} versions "
        f"{reading:.2f} s, diff {diffing:.2f} s; {diff.coverage.groups} groups, "
        f"{len(diff.coverage.regions)} regions, {len(diff.changes)} changes, "
        f"{len(gained)} versions gained, {len(lost)} lost, widens {diff.widens}"
    )


if __name__ == "__main__":
    main()
