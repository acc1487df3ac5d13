"""The policy a running server serves, and how it is replaced while serving.

A reload loads the whole directory again. A policy that does not load is refused: the
previous one keeps serving, and the refusal is logged and kept for `GET /admin/policy`.
Requests take the policy once, as they arrive (`gateway.api.security.pinned_policy`), so
one request is decided by one policy version from start to end.
"""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from gateway.errors import GatewayError
from gateway.policy.loader import DEFAULT_POLICY_DIR, LoadedPolicy, load_policy, policy_files

log = logging.getLogger("gateway.policy")


@dataclass(frozen=True)
class ReloadOutcome:
    at: dt.datetime
    outcome: Literal["loaded", "unchanged", "refused"]
    version: str  # the version serving afterwards
    problems: str = ""  # why a refused policy was refused


@dataclass(frozen=True)
class Serving:
    """The serving policy, when it was loaded and the last reload's outcome: replaced as
    one object, so a reader on another thread never pairs one load's version with another
    load's time or outcome."""

    policy: LoadedPolicy
    loaded_at: dt.datetime
    last_reload: ReloadOutcome | None


# How long the files must stay the same before the watcher loads a change: long enough for
# an editor's or a copy's in-place write, and far more than the microseconds between the
# writer's own looks (it asks before each turn).
SETTLE_S = 1.0


class PolicyStore:
    def __init__(
        self,
        directory: Path | None,
        settle_s: float = SETTLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.directory = directory or DEFAULT_POLICY_DIR
        self._settle_s, self._clock = settle_s, clock
        # A broken policy at startup is fatal.
        self._serving = Serving(load_policy(self.directory), dt.datetime.now(dt.UTC), None)
        self._lock = threading.Lock()  # one reload at a time (watcher, signal, admin route)
        self._seen = self._looked = self.fingerprint()
        self._looked_since = clock()  # when the files last looked different
        self.reloads: collections.Counter[str] = collections.Counter()  # by outcome (metrics)

    @property
    def current(self) -> LoadedPolicy:
        return self._serving.policy

    def fingerprint(self) -> tuple[tuple[str, int, int], ...]:
        """Cheap to compute every few seconds: names, sizes and modification times."""
        found = []
        for path in policy_files(self.directory):
            try:
                stat = path.stat()
            except OSError:
                continue  # removed while listing; the next look sees the directory settled
            found.append((path.name, stat.st_size, stat.st_mtime_ns))
        return tuple(found)

    def reload_if_changed(self) -> ReloadOutcome | None:
        """For the file watcher (and the writer, before each turn): reload when the files
        changed since the last load and have since looked the same for `settle_s`. A file
        an editor or a copy is still writing is not loaded half-written: an empty
        policy.yaml, say, is a valid policy of defaults, with no admins and the default
        retention."""
        seen, now = self.fingerprint(), self._clock()
        if seen != self._looked:
            self._looked, self._looked_since = seen, now
        if seen == self._seen or now - self._looked_since < self._settle_s:
            return None
        self._seen = seen
        return self.reload()

    def reload(self) -> ReloadOutcome:
        with self._lock:
            now = dt.datetime.now(dt.UTC)
            serving = self._serving
            try:
                fresh = load_policy(self.directory)
            except GatewayError as exc:
                outcome = ReloadOutcome(now, "refused", serving.policy.version, exc.detail)
                log.error(
                    "policy reload refused, version %s keeps serving: %s",
                    serving.policy.version,
                    exc.detail,
                )
                self._serving = replace(serving, last_reload=outcome)
            else:
                changed = fresh.version != serving.policy.version
                outcome = ReloadOutcome(now, "loaded" if changed else "unchanged", fresh.version)
                if changed:
                    log.info("policy %s replaces %s", fresh.version, serving.policy.version)
                    self._serving = Serving(fresh, now, outcome)
                else:
                    self._serving = replace(serving, last_reload=outcome)
            self.reloads[outcome.outcome] += 1
            return outcome

    def state(self) -> Serving:
        """The serving policy, when it was loaded and the last reload's outcome, all of one
        moment, whatever reload runs meanwhile on another thread."""
        return self._serving


async def watch(store: PolicyStore, interval_s: float) -> None:
    """Reload when the policy files change; runs until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(store.reload_if_changed)
        except Exception:  # the watcher must outlive any one bad look at the directory
            log.exception("policy watch failed; retrying")


def _reload_now(store: PolicyStore) -> None:
    """A reload nobody awaits: its failure is logged here, not left to asyncio's report of
    a result never retrieved."""
    try:
        store.reload()
    except Exception:
        log.exception("policy reload on SIGHUP failed; the served policy stays")


def reload_on_sighup(store: PolicyStore) -> Callable[[], None] | None:
    """`kill -HUP` reloads the policy; returns how to undo it, or None where signals cannot
    be handled (not the main thread, as under a test client; or no SIGHUP on this system)."""
    loop = asyncio.get_running_loop()
    hangup = getattr(signal, "SIGHUP", None)
    if hangup is None:
        return None
    try:
        loop.add_signal_handler(hangup, lambda: loop.run_in_executor(None, _reload_now, store))
    except (NotImplementedError, RuntimeError, ValueError):
        return None
    # One of a `serve --processes N` starts with SIGHUP blocked (gateway/api/processes.py):
    # a reload asked while it started waits until now, instead of killing it.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {hangup})

    def undo() -> None:
        loop.remove_signal_handler(hangup)
        # Still stopping (the audit records waiting are being written): a reload asked now
        # is moot, and SIGHUP's default action would kill the process.
        signal.signal(hangup, signal.SIG_IGN)

    return undo
