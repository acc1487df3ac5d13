"""A lane's worker threads, shared fairly between tenants.

A plain thread pool serves calls in arrival order, so one tenant sending a flood puts
every other tenant's request behind all of its calls. Here each tenant has its own queue
and the workers take the next call round-robin across the tenants that have one waiting:
a request waits behind at most one call per other busy tenant, whatever their volume.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from gateway.placement import pin_this_thread

T = TypeVar("T")


class FairExecutor:
    def __init__(self, workers: int, name: str, cpus: frozenset[int] | None = None) -> None:
        self._cpus = cpus  # where its threads run (`placement`); None: anywhere
        self._queues: OrderedDict[str, deque[tuple[Future[Any], Callable[[], Any]]]] = OrderedDict()
        self._ready = threading.Condition()
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{n}", daemon=True)
            for n in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, tenant: str, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        with self._ready:
            if self._stopped:
                raise RuntimeError("the executor is shut down")
            self._queues.setdefault(tenant, deque()).append((future, fn))
            self._ready.notify()
        return future

    def waiting(self) -> int:
        with self._ready:
            return sum(len(q) for q in self._queues.values())

    def _next(self) -> tuple[Future[Any], Callable[[], Any]]:
        """The oldest call of the tenant whose turn it is; that tenant goes to the back."""
        tenant, queue = next(iter(self._queues.items()))
        call = queue.popleft()
        if queue:
            self._queues.move_to_end(tenant)
        else:
            del self._queues[tenant]
        return call

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        return tuple(self._threads)

    def _work(self) -> None:
        pin_this_thread(self._cpus)
        while True:
            with self._ready:
                while not self._queues and not self._stopped:
                    self._ready.wait()
                if self._stopped:
                    return
                future, fn = self._next()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # the caller's await raises it
                future.set_exception(exc)

    def shutdown(self) -> None:
        """Stop taking calls; calls not started are cancelled, running ones finish."""
        with self._ready:
            self._stopped = True
            for queue in self._queues.values():
                for future, _ in queue:
                    future.cancel()
            self._queues.clear()
            self._ready.notify_all()
