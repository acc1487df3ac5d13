"""A request's stage clock: when each stage ran and what it may report (IDs, counts).

Stages run in the request task and in lane threads; they record here and the tracing
module turns the record into spans afterwards, so retrieval code never touches the SDK.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StageTime:
    start_ns: int  # wall clock, as OpenTelemetry wants it
    end_ns: int

    @property
    def ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


@dataclass
class StageClock:
    stages: dict[str, StageTime] = field(default_factory=dict)
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)
    started_ns: int = field(default_factory=time.time_ns)

    @contextmanager
    def stage(self, name: str, **attributes: Any) -> Iterator[dict[str, Any]]:
        """Time a stage; the yielded dict takes attributes learnt while it runs."""
        found = dict(attributes)
        start = time.time_ns()
        try:
            yield found
        finally:
            self.add(name, StageTime(start, time.time_ns()), **found)

    def add(self, name: str, when: StageTime, **attributes: Any) -> None:
        self.stages[name] = when
        self.attributes.setdefault(name, {}).update(attributes)

    def timings_ms(self) -> dict[str, float]:
        return {name: round(t.ms, 3) for name, t in self.stages.items()}


def timed_ns() -> int:
    return time.time_ns()
