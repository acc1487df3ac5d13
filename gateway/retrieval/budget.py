"""Run lanes concurrently, each under its own time budget, with bounded abandoned work.

A thread cannot be cancelled, so a lane past its budget keeps running to completion.
Requests queue for a lane's few workers, taking turns by tenant (`fair.py`; queueing
time counts against the budget). A call whose budget runs out before a worker took it is
withdrawn, never run; one that was running runs on, counted against its tenant. A tenant
with too many such calls still running has the lane skipped at once and reported
degraded, so its late work cannot pile up. The count is per tenant: one tenant's slow or
flooding searches fill its own slots, never another tenant's, and all tenants' late work
together can hold no more than the lane's workers (so two tenants late at once may hold
them all: the bound is per tenant, not a worker reserved for each). A call may start
one piece of work beside itself (BM25's ranking of whole documents) and ends only once
that piece has: a late call then holds a worker of each kind, still counted once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Generic, TypeVar

from gateway.retrieval.fair import FairExecutor
from gateway.telemetry.exceptions import describe

T = TypeVar("T")
log = logging.getLogger("gateway.retrieval")


def log_failure(what: str, exc: BaseException) -> None:
    """`what`, the exception's type and where it was raised, never its message: a lane's
    exception can quote the query (a query parser's does), and logs carry IDs only."""
    log.error("%s: %s\n%s", what, type(exc).__name__, describe(exc))


@dataclass(frozen=True)
class LaneOutcome(Generic[T]):
    name: str
    result: T | None  # None when the lane was degraded
    reason: str | None  # "timeout", "error", "saturated"


class BudgetedPool:
    """One lane's workers, and per tenant a count of its abandoned calls still running."""

    def __init__(
        self,
        name: str,
        workers: int,
        max_abandoned: int,
        cpus: frozenset[int] | None = None,
        beside: bool = False,
    ) -> None:
        self.name = name
        self._executor = FairExecutor(workers, name, cpus)
        # `beside`: as many workers again, for work a call starts to run beside itself
        # (`start_beside`). Each call waits for what it started, so at most one such piece
        # per worker is ever pending: they never queue, and a call past its budget is
        # still counted abandoned until its piece is done too. They run on any CPU, not on
        # `cpus`: pinned beside the call (`split` on two CPUs), the two took turns on one
        # CPU where they are the longer lane, and BM25 by document at 1M went from p95
        # 24.9-33.9 ms to 34.1-38.9 (docs/evaluation.md, "Where the hot path's time goes").
        self._beside = FairExecutor(workers, f"{name}-beside") if beside else None
        self._max_abandoned = max_abandoned  # per tenant
        self._abandoned: Counter[str] = Counter()  # touched only on the event loop thread
        self.abandoned_total = 0  # calls whose result came past the budget or never (metrics)
        self.skipped_total = 0  # calls refused because too many were still running

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        beside = self._beside.threads if self._beside is not None else ()
        return self._executor.threads + beside

    def start_beside(self, tenant: str, fn: Callable[[], T]) -> Future[T]:
        """`fn` on a worker of its own, for a call of this pool to wait for (see above)."""
        if self._beside is None:
            raise RuntimeError(f"lane {self.name} has no workers beside its calls")
        return self._beside.submit(tenant, fn)

    @property
    def abandoned(self) -> int:
        """Abandoned calls still running, all tenants together (metrics)."""
        return self._abandoned.total()

    def abandoned_by(self, tenant: str) -> int:
        return self._abandoned[tenant]

    async def run(self, fn: Callable[[], T], budget_s: float, tenant: str = "") -> LaneOutcome[T]:
        """`fn` on one of the lane's workers, taking turns with other tenants' calls."""
        if self._abandoned[tenant] >= self._max_abandoned:
            # The tenant's own late calls hold its slots; other tenants' are not counted.
            log.warning(
                "lane %s skipped for a tenant: %d of its abandoned calls still running",
                self.name,
                self._abandoned[tenant],
            )
            self.skipped_total += 1
            return LaneOutcome(self.name, None, "saturated")
        started = time.perf_counter()
        call = self._executor.submit(tenant, fn)
        future = asyncio.wrap_future(call)
        try:
            result = await asyncio.wait_for(asyncio.shield(future), timeout=budget_s)
        except TimeoutError:
            self._let_go(call, future, tenant)
            return self._late(budget_s)
        except asyncio.CancelledError:
            # The request itself was cancelled (its client gone, a shutdown): its call is
            # late work like a timed-out one, or the queue and the workers would fill
            # with calls no one waits for, uncounted.
            self._let_go(call, future, tenant)
            raise
        except Exception as exc:
            log_failure(f"lane {self.name} failed", exc)
            return LaneOutcome(self.name, None, "error")
        # wait_for hands back a result that raced its timer; past the budget it is late all
        # the same, and a budget must mean the same thing whichever callback ran first.
        if time.perf_counter() - started > budget_s:
            return self._late(budget_s)
        return LaneOutcome(self.name, result, None)

    def _let_go(self, call: Future[T], future: asyncio.Future[T], tenant: str) -> None:
        """A call no one will wait for: withdrawn if not started yet, so that queued late
        work never runs at all; else counted against its tenant until it ends."""
        if not call.cancel():
            self._abandoned[tenant] += 1
            future.add_done_callback(lambda done: self._finished_abandoned(tenant, done))

    def _finished_abandoned(self, tenant: str, future: asyncio.Future[T]) -> None:
        self._abandoned[tenant] -= 1
        if self._abandoned[tenant] <= 0:
            del self._abandoned[tenant]
        if not future.cancelled() and future.exception() is not None:
            log.info("abandoned call of lane %s finished with an error", self.name)

    def _late(self, budget_s: float) -> LaneOutcome[T]:
        self.abandoned_total += 1
        log.warning("lane %s exceeded its budget of %.3f ms", self.name, budget_s * 1000)
        return LaneOutcome(self.name, None, "timeout")

    def shutdown(self) -> None:
        self._executor.shutdown()
        if self._beside is not None:
            self._beside.shutdown()
