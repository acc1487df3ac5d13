"""Which CPUs the lanes' worker threads run on (`GATEWAY_LANE_CPUS`).

`shared` leaves placement to the kernel. `split` gives the dense lane's
workers (query embedding, then the vector search: the longer lane) their own CPUs, and
the other lanes' workers and the audit writer the rest; the event loop, the threads it
starts and BM25's workers for whole documents (`BudgetedPool`'s workers beside its
calls) stay free to run anywhere, and a process started from this one (the writer of
`gateway serve`) inherits no restriction. A thread a pinned worker starts inherits that
worker's CPUs, as Linux does: a pool pyarrow or LanceDB starts lazily during a search
(LanceDB's, for the dense lane's approximate search of a large universe) then stays on
the dense lane's CPUs. The halves are by CPU number, not by core: where two hyperthreads
of one core have distant numbers, both halves may share cores.

Why: on the team's two-vCPU VM (Firecracker, Linux 6.18), a search wakes the BM25 and
the dense workers at once, and in 13-24% of searches the dense worker started 2-4 ms
late, runnable but queued (its `run_delay` in /proc/thread-self/schedstat), in 33 of 51
such searches on the vCPU the BM25 worker was running on; split, 3 of 400 started late,
one of them queued. `scripts/measure_hot_path.py --also-env GATEWAY_LANE_CPUS=split` on the 200k
bench, 4 alternated rounds: p95 at one client 9.8-10.5 ms (12.9 in a round the host
slowed) against 11.6-12.8 ms shared, 8-client QPS 141-144 against 131-142; SciFact by
document, `top_k` 100: p95 19.0 against 20.3-21.2 ms (docs/evaluation.md, "Where the hot
path's time goes").

`auto` (the default) splits only where that was measured: a process serving alone that
may use exactly two CPUs. Elsewhere it shares: with more CPUs the gain is unmeasured and
pinned workers cannot move to a CPU another program leaves idle; and the processes of a
`gateway serve --processes N` would all put their dense lanes on the same CPUs (two gave
82-83 QPS split against 88-94 shared: docs/operations.md, "Several processes on one
host").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger("gateway.retrieval")  # the lanes' placement

LaneCpus = Literal["auto", "shared", "split"]
OWN_CPUS_LANE = "dense"
AUTO_SPLIT_CPUS = 2  # the one count of CPUs `split` was measured to gain on


@dataclass(frozen=True)
class Placement:
    """CPU sets for the lanes' workers; None: anywhere."""

    dense: frozenset[int] | None = None
    others: frozenset[int] | None = None

    @classmethod
    def plan(
        cls, setting: LaneCpus, allowed: Iterable[int] | None = None, alone: bool = True
    ) -> Placement:
        """`split`: the upper half of the CPUs this process may use (rounded up) for the
        dense lane, the lower half for the rest; with fewer than two CPUs, nothing to split.
        `auto`: `split` for a process serving `alone` that may use exactly AUTO_SPLIT_CPUS
        CPUs, `shared` otherwise."""
        if setting == "shared":
            return cls()
        found = usable_cpus() if allowed is None else allowed
        if found is None:
            if setting == "split":
                log.warning("lane_cpus=split: this system cannot pin threads, so the lanes share")
            return cls()
        cpus = sorted(found)
        if setting == "auto" and not (alone and len(cpus) == AUTO_SPLIT_CPUS):
            log.info(
                "lane workers share the CPUs (lane_cpus=auto: %d CPUs, %s)",
                len(cpus),
                "one serving process" if alone else "one of several serving processes",
            )
            return cls()
        if len(cpus) < 2:
            log.warning("lane_cpus=split: one CPU to run on, so the lanes share it")
            return cls()
        half = len(cpus) // 2
        log.info(
            "lane workers placed: dense on CPUs %s, other lanes and the audit writer on %s",
            cpus[half:],
            cpus[:half],
        )
        return cls(dense=frozenset(cpus[half:]), others=frozenset(cpus[:half]))

    @property
    def kind(self) -> LaneCpus:
        """What the plan amounts to: `split` or `shared`."""
        return "shared" if self.dense is None else "split"

    def for_lane(self, name: str) -> frozenset[int] | None:
        return self.dense if name == OWN_CPUS_LANE else self.others


def usable_cpus() -> frozenset[int] | None:
    """The CPUs this process may run on (its affinity: a container's cpuset, not the
    host's CPUs); None where the system cannot say (Linux only)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return frozenset(os.sched_getaffinity(0))


def pin_this_thread(cpus: frozenset[int] | None) -> None:
    """The calling thread (Linux: pid 0 names it, not the process) on `cpus` only. A
    refusal (a CPU taken from the process meanwhile) leaves it free, with a warning: a
    worker thread that died here would leave its lane without workers."""
    if cpus is None:
        return
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        log.warning("CPUs %s refused (%s); this thread runs anywhere", sorted(cpus), exc)
