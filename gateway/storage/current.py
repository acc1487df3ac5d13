"""The generation a server serves: always the newest one the catalog has committed.

Each request asks the catalog which generation is current (one indexed read) and, when a
newer one has committed, waits for it to open before reading anything: a change is
visible to the very next request after the command that made it returns. A watcher opens
new generations in the background meanwhile, so that wait is usually nothing.

A generation that cannot be served (built with another embedding model) fails closed, as
it does at startup: while it is the newest, retrieval answers 503 and readiness fails,
naming the generation and the fix. Serving the one before would be a silent split: search
would keep ACLs and deletions the catalog (and `/documents`) no longer has.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from gateway.errors import GatewayError
from gateway.storage.catalog import Catalog
from gateway.storage.layout import DataLayout, ServedIndex, open_served

log = logging.getLogger("gateway.storage")


class ServedIndexes:
    def __init__(self, layout: DataLayout, catalog: Catalog, model_name: str, dim: int) -> None:
        self._layout, self._catalog = layout, catalog
        self._model_name, self._dim = model_name, dim
        self._lock = threading.Lock()
        self._served: ServedIndex | None = None
        self._refused: dict[int, str] = {}  # generation -> why it cannot be served
        self._open(strict=True)

    @property
    def served(self) -> ServedIndex | None:
        return self._served

    def _newer(self) -> int | None:
        latest = self._catalog.current_generation_id()
        served = self._served
        if latest is None or latest in self._refused:
            return None
        return latest if served is None or served.number < latest else None

    def _open(self, strict: bool = False) -> None:
        with self._lock:  # one opening at a time; a second caller finds it done
            try:
                opened = open_served(self._layout, self._catalog, self._model_name, self._dim)
            except GatewayError as exc:
                if strict:
                    raise
                latest = self._catalog.current_generation_id()
                if latest is not None:  # the public reason names no model: the log has it
                    self._refused[latest] = (
                        f"index generation {latest} cannot be served ({exc.code}); "
                        "the previous one is not served either, to enforce no stale ACL"
                    )
                log.error("generation %s cannot be served; retrieval fails: %s", latest, exc)
                return
            if opened is not None and (self._served is None or opened.number > self._served.number):
                self._served = opened

    def refusal(self) -> str | None:
        """Why the newest committed generation cannot be served; None when it can."""
        latest = self._catalog.current_generation_id()
        return None if latest is None else self._refused.get(latest)

    async def current(self) -> ServedIndex:
        """The newest committed generation, opened before this returns."""
        if self._newer() is not None:
            await asyncio.to_thread(self._open)
        refused = self.refusal() if self._refused else None  # no second look when none was
        if refused is not None:
            raise GatewayError("not_ready", refused)
        if self._served is None:
            raise GatewayError("not_ready", "no index generation yet: run `gateway ingest` first")
        return self._served

    async def watch(self, interval_s: float) -> None:
        """Open new generations as they commit; runs until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                if self._newer() is not None:
                    await asyncio.to_thread(self._open)
            except Exception:  # keep watching: the next look may succeed
                log.exception("opening a new generation failed; retrying")
