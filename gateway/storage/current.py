"""The generation a server serves: always the newest one the catalog has committed.

Each request asks the catalog which generation is current and, when a newer one has
committed, waits for it to open before reading anything: a change is visible to the very
next request after the command that made it returns. With SQLite the question costs a few
microseconds. With a database server it would cost a round trip, so requests take the
answer a watcher polled at most a second ago (`fresh=True` asks the database, for the
routes that answer a change), and the replica registry closes the gap: a change is
answered only once every replica reports serving it (`gateway/storage/replicas.py`). The
watcher opens new generations in the background meanwhile, so the wait is usually nothing.
With `GATEWAY_WARM_INDEX=auto` the watcher also warms each newer generation once it is
served (`gateway/storage/warm.py`); the one served at startup is warmed before the server
says ready.

A generation that cannot be served (built with another embedding model) fails closed, as
it does at startup: while it is the newest, retrieval answers 503 and readiness fails,
naming the generation and the fix. Serving the one before would be a silent split: search
would keep ACLs and deletions the catalog (and `/documents`) no longer has.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from gateway.errors import GatewayError
from gateway.storage.catalog import Catalog
from gateway.storage.layout import (
    DataLayout,
    ServedIndex,
    open_served,
    prune_lexical,
    remove_erased_copies,
)
from gateway.storage.warm import warm_index

log = logging.getLogger("gateway.storage")
POLLED_FOR_S = 1.0  # how long a polled generation number stands for the database's
REPORT_EVERY_S = 1.0  # how often a replica says which generation it serves
PROBE_STORE_EVERY_S = 5.0  # how often a replica checks that the object store answers


class ServedIndexes:
    def __init__(
        self,
        layout: DataLayout,
        catalog: Catalog,
        model_name: str,
        dim: int,
        table_above: Callable[[], int] | None = None,
        warm: bool = False,
        vector_documents: Callable[[], bool] = lambda: False,
    ) -> None:
        """`table_above()`: the policy's `flat_search_max_rows` (see `open_served`);
        `warm`: each generation made ready for its first searches (`gateway/storage/
        warm.py`): the one served at startup before this returns, later ones by the
        watcher once they are served; `vector_documents()`: whether the policy ranks
        documents by a vector of each (`retrieval.document_vector`), which the warm then
        makes too."""
        self._layout, self._catalog = layout, catalog
        self._model_name, self._dim = model_name, dim
        self._table_above = table_above
        self._warm = warm
        self._vector_documents = vector_documents
        # Served, for the watcher to warm, and the generation before it (whose row names
        # it takes; dropped once warmed, so that no chain of generations stays alive).
        self._unwarmed: tuple[ServedIndex, ServedIndex | None] | None = None
        # The partitions the generations served so far have opened, which a newer one
        # opens ahead; None: all of them (nothing was served yet).
        self._wanted: set[str] | None = None
        self._first_warmed = not warm
        # The generation whose document vectors the watcher last made (or tried to) for a
        # policy that came to ask for them after its warm.
        self._documents_for: int | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._served: ServedIndex | None = None
        self._refused: dict[int, str] = {}  # generation -> why it cannot be served
        self._polled: tuple[float, int | None] | None = None  # (monotonic time, generation)
        self._reported: int | None = None
        self._reported_at = 0.0
        # With an object store: whether it answered at the last look (None: no store).
        self.store_reachable: bool | None = True if layout.store is not None else None
        self._probed_at = 0.0
        self._erased_through = 0  # this data dir holds no generation older than this
        self._open(strict=True, warm_now=True)

    @property
    def served(self) -> ServedIndex | None:
        return self._served

    def _latest(self, fresh: bool = False) -> int | None:
        polled = self._polled
        if fresh or self._catalog.cheap_generation_check or polled is None:
            return self._catalog.current_generation_id()
        if time.monotonic() - polled[0] > POLLED_FOR_S:  # the watcher is stuck or failing
            return self._catalog.current_generation_id()
        return polled[1]

    def _newer(self, fresh: bool = False) -> int | None:
        latest = self._latest(fresh)
        served = self._served
        if latest is None or latest in self._refused:
            return None
        return latest if served is None or served.number < latest else None

    def _open(self, strict: bool = False, warm_now: bool = False) -> None:
        with self._lock:  # one opening at a time; a second caller finds it done
            try:
                opened = open_served(
                    self._layout,
                    self._catalog,
                    self._model_name,
                    self._dim,
                    self._served,
                    table_above=self._table_above() if self._table_above else None,
                )
            except GatewayError as exc:
                if exc.code == "not_ready" and self._layout.store is not None:
                    self.store_reachable = False
                # A transient failure (the object store or the database away) is never
                # recorded as a refusal, nor a reason to serve the previous generation.
                if strict or exc.transient:
                    raise  # this request fails (503); the next one tries again
                latest = self._catalog.current_generation_id()
                if latest is not None:  # the public reason names no model: the log has it
                    self._refused[latest] = (
                        f"index generation {latest} cannot be served ({exc.code}); "
                        "the previous one is not served either, to enforce no stale ACL"
                    )
                log.error("generation %s cannot be served; retrieval fails: %s", latest, exc)
                return
            if opened is not None and (self._served is None or opened.number > self._served.number):
                before, self._served = self._served, opened
                if self._warm and before is not None and self._wanted is not None:
                    self._wanted |= set(before.lexical.opened)
                if self._warm and warm_now:  # at startup: before ready
                    documents = self._vector_documents()
                    warm_index(self._layout, opened, documents=documents)
                    self._wanted, self._first_warmed = set(opened.lexical.opened), True
                    if documents:  # made, or left (over the budget) on purpose
                        self._documents_for = opened.number
                elif self._warm:  # later: while requests already search it
                    # The row names come from the last generation warmed: one never warmed
                    # (a newer one came first) holds only what its searches opened.
                    last = self._unwarmed[1] if self._unwarmed is not None else before
                    self._unwarmed = (opened, last)
                if self._layout.store is not None:  # this replica's own copies
                    prune_lexical(self._layout, opened.number, unfinished=False)
        self._erase_older()

    @property
    def warming_first(self) -> bool:
        """Whether the first generation served is still being warmed (the data dir was
        empty at startup): not ready yet."""
        return self._served is not None and not self._first_warmed

    def warm_pending(self) -> None:
        """Warm the generation served since the watcher last looked, opening the partitions
        the ones before had opened (all, for the first), until a newer one is served (it
        has its own turn) or the server stops. Not on a request's path: a request that
        finds a newer generation opens it and searches at once, paying what it would have
        without warming (but for the GIL the warm takes between slices), and less once
        this has run."""
        with self._lock:
            pending, self._unwarmed = self._unwarmed, None
            wanted = None if self._wanted is None else sorted(self._wanted)
        if pending is None:
            return
        served, previous = pending

        def keep_going() -> bool:
            return served is self._served and not self._stopping.is_set()

        try:
            documents = self._vector_documents()
            if documents:  # made by this warm, or left (over the budget) on purpose
                self._documents_for = served.number
            warm_index(self._layout, served, wanted, "on change", keep_going, previous, documents)
        finally:
            with self._lock:
                self._wanted = (self._wanted or set()) | set(served.lexical.opened)
                if served is self._served:  # else the newer one has its own turn
                    self._first_warmed = True

    def _erase_older(self) -> None:
        """Once this process serves an erasure generation (or a newer one), its data dir
        keeps no older generation nor vector copy: they hold erased versions. A replica
        that was down when the erasure ran does it when it comes back. Not while another
        replica still serves an older one: it may share this data dir."""
        served = self._served
        if served is None:
            return
        try:  # the watcher looks again within a second
            self._erased_through = remove_erased_copies(
                self._layout, self._catalog, served.number, self._erased_through
            )
        except GatewayError as exc:  # the catalog is away: the next look does it
            log.warning("erasure barrier unknown (%s: %s); retrying", exc.code, exc.detail)

    def behind(self) -> bool:
        """Whether the catalog has a generation newer than the one served (asks it)."""
        return self._newer(fresh=True) is not None

    def refusal(self, fresh: bool = False) -> str | None:
        """Why the newest committed generation cannot be served; None when it can."""
        latest = self._latest(fresh)
        return None if latest is None else self._refused.get(latest)

    async def current(self, fresh: bool = False) -> ServedIndex:
        """The newest committed generation, opened before this returns; `fresh` asks the
        database itself, never a polled answer."""
        if self._newer(fresh) is not None:
            await asyncio.to_thread(self._open)
        refused = self.refusal(fresh) if self._refused else None  # no second look when none was
        if refused is not None:
            raise GatewayError("not_ready", refused)
        if self._served is None:
            raise GatewayError("not_ready", "no index generation yet: run `gateway ingest` first")
        return self._served

    async def watch(self, interval_s: float) -> None:
        """Open new generations as they commit, warm them, and say which one this replica
        serves; runs until cancelled."""
        warming: asyncio.Task[None] | None = None
        while True:
            await asyncio.sleep(interval_s)
            try:
                latest = await asyncio.to_thread(self._catalog.current_generation_id)
                self._polled = (time.monotonic(), latest)
                if self._newer() is not None:
                    await asyncio.to_thread(self._open)
                idle = warming is None or warming.done()
                if self._unwarmed is not None and idle:
                    # Its own task: reports and erasures keep their pace meanwhile.
                    warming = asyncio.create_task(asyncio.to_thread(self.warm_pending))
                    warming.add_done_callback(_log_failed_warm)
                elif idle and (served_index := self._documents_wanted()) is not None:
                    warming = asyncio.create_task(asyncio.to_thread(_make_documents, served_index))
                    warming.add_done_callback(_log_failed_warm)
                if time.monotonic() - self._probed_at > PROBE_STORE_EVERY_S:
                    await asyncio.to_thread(self._probe_store)
                served = self._served.number if self._served is not None else None
                stale = time.monotonic() - self._reported_at > REPORT_EVERY_S
                if served != self._reported or stale:  # never from a request: it writes
                    await asyncio.to_thread(self._report)
                    await asyncio.to_thread(self._erase_older)
            except GatewayError as exc:  # e.g. catalog_unavailable: requests ask it themselves
                self._polled = None
                log.warning("watching generations failed (%s: %s); retrying", exc.code, exc.detail)
            except Exception:  # keep watching: the next look may succeed
                self._polled = None
                log.exception("watching generations failed; retrying")

    def _documents_wanted(self) -> ServedIndex | None:
        """The served generation, once, when the policy has come to rank documents by
        vector since it was warmed (a reload; a warm that was asked for them is not asked
        again): its document vectors are then made in the background, not by its first
        search by document."""
        served = self._served
        if not self._warm or served is None or self._unwarmed is not None:
            return None
        if self._documents_for == served.number or not self._vector_documents():
            return None
        self._documents_for = served.number
        return served

    def _probe_store(self) -> None:
        self._probed_at = time.monotonic()
        if self._layout.store is not None:
            self.store_reachable = self._layout.store.answers()

    def _report(self) -> None:
        served = self._served
        if served is not None:
            self._catalog.replicas.report(served.number)
            self._reported, self._reported_at = served.number, time.monotonic()

    def leave(self) -> None:
        """This replica stops serving: no change waits for it any more, and warming stops."""
        self._stopping.set()
        self._catalog.replicas.leave()

    async def everywhere(self, generation: int, timeout_s: float) -> list[str]:
        """Wait until every replica seen recently serves `generation` or a newer one; the
        labels of those that still do not after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            behind = await asyncio.to_thread(self._catalog.replicas.behind, generation)
            if not behind or time.monotonic() > deadline:
                return behind
            await asyncio.sleep(0.02)


def _make_documents(served: ServedIndex) -> None:
    served.flat.documents()


def _log_failed_warm(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("warming a newer generation failed (%s)", type(exc).__name__)
