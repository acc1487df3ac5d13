"""Run lanes concurrently, each under its own time budget, with bounded abandoned work.

A thread cannot be cancelled, so a lane past its budget keeps running to completion. Each
lane therefore owns a small pool; when all of its workers are still busy (abandoned or
not), the lane is skipped at once and reported degraded instead of queueing more work.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger("gateway.retrieval")


@dataclass(frozen=True)
class LaneOutcome(Generic[T]):
    name: str
    result: T | None  # None when the lane was degraded
    reason: str | None  # "timeout", "error", "saturated"


class BudgetedPool:
    """One lane's workers; at most `max_inflight` calls run at once, abandoned ones included."""

    def __init__(self, name: str, max_inflight: int) -> None:
        self.name = name
        self._executor = ThreadPoolExecutor(max_workers=max_inflight, thread_name_prefix=name)
        self._slots = threading.BoundedSemaphore(max_inflight)

    async def run(self, fn: Callable[[], T], budget_s: float) -> LaneOutcome[T]:
        if not self._slots.acquire(blocking=False):
            log.warning("lane %s saturated: skipped", self.name)
            return LaneOutcome(self.name, None, "saturated")
        started = time.perf_counter()
        future = asyncio.get_running_loop().run_in_executor(self._executor, fn)
        future.add_done_callback(lambda _f: self._slots.release())
        try:
            result = await asyncio.wait_for(asyncio.shield(future), timeout=budget_s)
        except TimeoutError:
            future.add_done_callback(_consume)  # the late result is dropped, not leaked
            return self._late(budget_s)
        except Exception:
            log.exception("lane %s failed", self.name)
            return LaneOutcome(self.name, None, "error")
        # wait_for hands back a result that raced its timer; past the budget it is late all
        # the same, and a budget must mean the same thing whichever callback ran first.
        if time.perf_counter() - started > budget_s:
            return self._late(budget_s)
        return LaneOutcome(self.name, result, None)

    def _late(self, budget_s: float) -> LaneOutcome[T]:
        log.warning("lane %s exceeded its budget of %.3f ms", self.name, budget_s * 1000)
        return LaneOutcome(self.name, None, "timeout")

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _consume(future: asyncio.Future[T]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.info("abandoned lane finished with an error")
