"""What one request's stages share: the generation it pinned, the policy, the caller, the
question and its stage clock. One frozen value, built once per request and passed along,
so every stage reads the same generation and policy (a reload or a new generation in the
middle of a request changes nothing for it)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from gateway.domain import Caller
from gateway.policy.model import Policy
from gateway.storage.layout import ServedIndex
from gateway.telemetry.stages import StageClock


@dataclass(frozen=True, slots=True)
class RequestScope:
    index: ServedIndex  # the generation this request reads, pinned before the first stage
    policy: Policy
    caller: Caller
    query: str
    top_k: int
    clock: StageClock
    as_of: dt.date | None = None  # None: today (UTC), when the search restricts
