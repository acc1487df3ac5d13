"""Request rates per subject and per tenant, from the policy's `limits` (token buckets).

A caller's request takes one token from its own bucket and one from its tenant's; a bucket
holds at most `burst` tokens and refills at `rate_per_s`. Without a token the request is
429 `rate_limited` with `Retry-After`, before it costs anything else. Buckets live in the
process: a deployment of N replicas admits up to N times the rate in total (divide the
policy's rates by N to bound the deployment). Absent limits mean unlimited.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from gateway.domain import Caller
from gateway.errors import GatewayError
from gateway.policy.model import Limits, Rate

MAX_BUCKETS = 100_000  # the least recently used go first: memory stays bounded


@dataclass
class _Bucket:
    tokens: float
    at: float


class RateLimiter:
    def __init__(self) -> None:
        self._buckets: OrderedDict[tuple[str, str], _Bucket] = OrderedDict()
        self._lock = threading.Lock()

    def admit(self, caller: Caller, limits: Limits) -> None:
        """Take a token for the caller and its tenant, or raise 429 `rate_limited`."""
        wanted = [
            (("subject", caller.cache_scope), limits.per_subject),
            (("tenant", caller.tenant), limits.per_tenant),
        ]
        checks = [(key, rate) for key, rate in wanted if rate is not None]
        if not checks:
            return
        now = time.monotonic()
        with self._lock:
            buckets = [(self._refilled(key, rate, now), rate) for key, rate in checks]
            short = [(bucket, rate) for bucket, rate in buckets if bucket.tokens < 1]
            if short:
                wait = max((1 - bucket.tokens) / rate.rate_per_s for bucket, rate in short)
                retry_after = max(1, math.ceil(wait))
                raise GatewayError(
                    "rate_limited",
                    f"over the policy's request rate; retry in {retry_after} s",
                    headers={"Retry-After": str(retry_after)},
                )
            for bucket, _ in buckets:
                bucket.tokens -= 1

    def _refilled(self, key: tuple[str, str], rate: Rate, now: float) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(rate.burst), now)
            if len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
            bucket.tokens = min(rate.burst, bucket.tokens + (now - bucket.at) * rate.rate_per_s)
            bucket.at = now
        return bucket
