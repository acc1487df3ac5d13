"""The writer `gateway serve` runs beside itself, kept running: restarted with backoff
whenever it dies, and its liveness told to `/readyz` and `/metrics`.

The writer is a child process (`gateway worker`); a thread here waits on it. When it exits
without being asked to, it is started again after a delay that doubles with each quick
death (1 s, 2 s, 4 s ... at most a minute) and starts over once a writer has run for a
minute. Its jobs are safe meanwhile: the next writer resumes what the dead one left
running. This server is not ready (jobs sent to it would wait for nothing) while the writer
is down for longer than its restart delay (plus the time a start may take), or once it has
died QUICK_DEATHS times in a row within a minute of starting, until one runs a minute.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable

log = logging.getLogger("gateway.worker")
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
STEADY_S = 60.0  # a writer that ran this long died of something new: the delay starts over
START_GRACE_S = 5.0  # beyond the delay, how long a restart may take before it counts as down
QUICK_DEATHS = 3  # deaths (or failed starts) in a row, each within STEADY_S: a crash loop


class WriterSupervisor:
    """Starts the writer with `start`, restarts it when it dies, stops it with `stop`."""

    def __init__(
        self,
        start: Callable[[], subprocess.Popen[bytes]],
        stop: Callable[[subprocess.Popen[bytes]], None],
        first_backoff_s: float = FIRST_BACKOFF_S,
    ) -> None:
        self._start, self._stop = start, stop
        self._first_backoff_s = first_backoff_s
        self.backoff_s = first_backoff_s  # the delay before the next restart
        self.restarts = 0
        self._quick_deaths = 0  # in a row, each within STEADY_S of its start
        self._process: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0
        # When the writer was last seen dying; a start that fails does not reset it.
        self._down_since: float | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="writer-supervisor", daemon=True)

    @property
    def up(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    def healthy(self) -> bool:
        """Up, or down no longer than its restart takes (the delay, then a start); never
        while it is crash looping, until a writer has run STEADY_S."""
        if self.up and time.monotonic() - self._started_at >= STEADY_S:
            return True
        if self._quick_deaths >= QUICK_DEATHS:
            return False
        if self.up:
            return True
        if self._stopping.is_set() or not self._thread.is_alive():
            return False  # not supervised (yet, or any more): nothing restarts it
        down_since = self._down_since
        if down_since is None:
            return True  # it has just died: the watcher is about to see it
        return time.monotonic() - down_since <= self.backoff_s + START_GRACE_S

    def start(self) -> None:
        self._launch()
        self._thread.start()

    def stop(self) -> None:
        """Stop supervising, then the writer (it finishes its turn first)."""
        self._stopping.set()
        self._thread.join(timeout=5)
        process = self._process
        if process is not None and process.poll() is None:
            self._stop(process)

    def _launch(self) -> None:
        try:
            self._process = self._start()
        except OSError as exc:  # e.g. no interpreter any more: tried again after the delay
            log.error("the writer could not be started (%s)", type(exc).__name__)
            self._process = None
            self._quick_deaths += 1
            if self._down_since is None:
                self._down_since = time.monotonic()
            return
        self._started_at = time.monotonic()
        self._down_since = None

    def _watch(self) -> None:
        while not self._stopping.is_set():
            process = self._process
            if process is not None:
                code = self._wait(process)
                if code is None:  # asked to stop
                    return
                ran = time.monotonic() - self._started_at
                if ran >= STEADY_S:
                    self.backoff_s, self._quick_deaths = self._first_backoff_s, 0
                self._quick_deaths += 1
                self._process, self._down_since = None, time.monotonic()
                log.error(
                    "the writer exited (status %s) after %.0f s; restarting in %.0f s",
                    code,
                    ran,
                    self.backoff_s,
                )
            if self._stopping.wait(self.backoff_s):
                return
            self._launch()
            self.restarts += 1
            self.backoff_s = min(MAX_BACKOFF_S, self.backoff_s * 2)

    def _wait(self, process: subprocess.Popen[bytes]) -> int | None:
        """The writer's exit status once it exits; None when asked to stop first."""
        while not self._stopping.is_set():
            try:
                return process.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                continue
        return None
