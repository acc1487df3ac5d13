"""Tenants share the retrieval path fairly: lane workers take turns by tenant, and a
tenant over the policy's bound on retrievals in flight waits for its own requests."""

from __future__ import annotations

import asyncio
import threading

from gateway.retrieval.fair import FairExecutor
from gateway.retrieval.gate import TenantGate


def test_a_flood_from_one_tenant_waits_behind_itself_not_ahead_of_others() -> None:
    executor = FairExecutor(workers=1, name="test")
    gate, started = threading.Event(), threading.Event()
    order: list[str] = []

    def call(label: str) -> None:
        started.set()
        gate.wait()
        order.append(label)

    try:
        futures = [executor.submit("flood", lambda n=n: call(f"flood-{n}")) for n in range(20)]
        assert started.wait(5)  # the one worker holds flood-0
        futures.append(executor.submit("quiet", lambda: call("quiet")))
        gate.set()
        for future in futures:
            future.result(timeout=5)
        assert order.index("quiet") == 2  # after the running call and one more of the flood
    finally:
        executor.shutdown()


def test_errors_reach_the_caller_and_shutdown_cancels_what_waits() -> None:
    executor = FairExecutor(workers=1, name="test")
    gate, started = threading.Event(), threading.Event()

    def hold() -> bool:
        started.set()
        return gate.wait()

    try:
        failing = executor.submit("a", lambda: 1 / 0)
        try:
            failing.result(timeout=5)
            raise AssertionError("the error was lost")
        except ZeroDivisionError:
            pass
        running = executor.submit("a", hold)
        assert started.wait(5)  # running, not waiting
        waiting = executor.submit("b", lambda: "never")
    finally:
        executor.shutdown()
        gate.set()
    assert waiting.cancelled() and running.result(timeout=5) is True


def test_a_tenant_over_its_bound_waits_for_its_own_while_others_go_in() -> None:
    async def scenario() -> list[str]:
        gate, order = TenantGate(), []
        release_a = asyncio.Event()

        async def retrieve(tenant: str, label: str, hold: asyncio.Event | None = None) -> None:
            async with gate.admit(tenant, 1):
                order.append(f"{label} in")
                if hold is not None:
                    await hold.wait()
            order.append(f"{label} out")

        first = asyncio.create_task(retrieve("a", "a1", release_a))
        await asyncio.sleep(0)
        second = asyncio.create_task(retrieve("a", "a2"))  # over the bound: waits
        given_up = asyncio.create_task(retrieve("a", "a3"))
        await asyncio.sleep(0)
        await retrieve("b", "b1")  # another tenant: straight in, a1 still running
        given_up.cancel()
        release_a.set()
        await asyncio.gather(first, second, return_exceptions=True)
        await asyncio.gather(given_up, return_exceptions=True)
        assert gate.running("a") == 0 and gate.running("b") == 0  # no place leaked
        return order

    assert asyncio.run(scenario()) == ["a1 in", "b1 in", "b1 out", "a1 out", "a2 in", "a2 out"]


def test_no_bound_admits_everyone() -> None:
    async def scenario() -> int:
        gate, inside = TenantGate(), 0
        peak = 0

        async def retrieve() -> None:
            nonlocal inside, peak
            async with gate.admit("a", None):
                inside += 1
                peak = max(peak, inside)
                await asyncio.sleep(0.01)
                inside -= 1

        await asyncio.gather(*(retrieve() for _ in range(5)))
        return peak

    assert asyncio.run(scenario()) == 5
