"""Requests of one tenant retrieving at once, bounded (the policy's
`limits.retrievals_per_tenant`): beyond the bound a tenant's requests wait for one of its
own to finish, in arrival order, while other tenants' requests go straight in. On a
machine with few cores a tenant's flood otherwise takes every core, and fair turns in the
lane pools (`fair.py`) cannot give back what the CPU is busy with.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class TenantGate:
    """Touched only on the event loop's thread."""

    def __init__(self) -> None:
        self._running: Counter[str] = Counter()
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}

    def running(self, tenant: str) -> int:
        return self._running[tenant]

    @asynccontextmanager
    async def admit(self, tenant: str, limit: int | None) -> AsyncIterator[None]:
        if limit is None or self._running[tenant] < limit:
            self._running[tenant] += 1
        else:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(tenant, deque()).append(turn)
            try:
                await turn  # a finishing request of the tenant hands over its place
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._release(tenant)  # handed over just as the caller gave up
                raise
        try:
            yield
        finally:
            self._release(tenant)

    def _release(self, tenant: str) -> None:
        waiting = self._waiting.get(tenant)
        while waiting:
            turn = waiting.popleft()
            if not turn.done():
                turn.set_result(None)  # the place passes on: the count stays
                return
        self._waiting.pop(tenant, None)
        self._running[tenant] -= 1
        if self._running[tenant] <= 0:
            del self._running[tenant]
