"""Admission of policy previews: how many run at once, per tenant and in all, each in a
thread of a pool of its own.

A preview is CPU work in Python (parse, validate, diff) that a tenant admin can start at
will. Run in the default executor it would hold the threads every other route's
`to_thread` waits for (eight previews once made `/readyz` take 56 s), so previews get their
own pool, and a preview that finds its tenant's slots (or all slots) taken is refused at
once (429 preview_busy) rather than queued: queued work would pile up behind work that
cannot be cancelled. A slot is held until its thread ends, not until the request does, so
a client that disconnects does not free a slot whose work still runs.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from gateway.errors import GatewayError
from gateway.policy.bounds import Preview

T = TypeVar("T")

_MAX_THREADS = 64  # Preview.max_concurrent's bound; threads start only as slots are used


class PreviewGate:
    """Per process; the serving policy's `preview:` gives the numbers at each admission."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, list[float]] = {}  # tenant -> deadlines of its previews
        self._pool = ThreadPoolExecutor(_MAX_THREADS, thread_name_prefix="policy-preview")

    def running(self, tenant: str | None = None) -> int:
        with self._lock:
            if tenant is not None:
                return len(self._running.get(tenant, ()))
            return sum(len(deadlines) for deadlines in self._running.values())

    def admit(self, tenant: str, bounds: Preview) -> float:
        """Take a slot for `tenant`, or 429 preview_busy; the slot's deadline."""
        now = time.monotonic()
        deadline = now + bounds.timeout_s
        with self._lock:
            mine = self._running.get(tenant, [])
            everyone = [d for deadlines in self._running.values() for d in deadlines]
            full = mine if len(mine) >= bounds.per_tenant else None
            if full is None and len(everyone) >= bounds.max_concurrent:
                full = everyone
            if full is None:
                self._running.setdefault(tenant, []).append(deadline)
                return deadline
        # A slot frees by the earliest deadline at the latest: past it a diff stops itself.
        wait = max(1, math.ceil(min(full) - now))
        raise GatewayError(
            "preview_busy",
            "a preview of your tenant is still running"
            if full is mine
            else "the server is running as many previews as it takes",
            headers={"Retry-After": str(wait)},
        )

    def release(self, tenant: str, deadline: float) -> None:
        with self._lock:
            deadlines = self._running.get(tenant, [])
            if deadline in deadlines:
                deadlines.remove(deadline)
            if not deadlines:
                self._running.pop(tenant, None)

    async def run(self, tenant: str, bounds: Preview, work: Callable[[float], T]) -> T:
        """`work(deadline)` in the previews' pool, once admitted; the slot frees when it ends."""
        deadline = self.admit(tenant, bounds)

        def held() -> T:
            try:
                return work(deadline)
            finally:
                self.release(tenant, deadline)

        try:
            future = self._pool.submit(held)
        except BaseException:
            self.release(tenant, deadline)
            raise
        return await asyncio.wrap_future(future)
