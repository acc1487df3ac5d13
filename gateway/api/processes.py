"""Serving one port from several processes (`gateway serve --processes N`), each with its
own GIL, and the state they must share to behave as one server.

One process in Python serves a request's lanes on threads, but its event loop, FastAPI and
the lanes' glue take turns on one GIL: on two cores at eight clients the machine stayed
about 20% idle. Several processes on one listening socket (uvicorn's supervisor, which
restarts a worker that dies) use that idle share. What a client must not notice is which
process answered, so these are shared through a private directory the parent makes:

- rate limits: the policy's buckets live in one SQLite file (`SharedRateLimiter`);
- `/metrics`: counters and histograms in prometheus_client's multiprocess files, and the
  series each process reads of itself when scraped (lanes, JWKS fetches, policy reloads,
  audit records pending) from the snapshot each process writes every second, summed;
- policy reloads: SIGHUP to the parent is passed on to every process (each reloads in
  place and keeps its policy if the new one is refused, as one process does), and
  `POST /admin/policy/reload` sends it for the others (`reload_everywhere`);
- the writer's liveness: the parent runs the writer and writes its state for every
  process's `/readyz` and `/metrics` (`WriterReport`).

What stays each process's own: `limits.retrievals_per_tenant` (it bounds the lanes of the
process that runs them), the policy previews' slots, the audit writer (each commits its
own records), the caches.

A process that dies is replaced; one that cannot start once the group has served (a
policy refused on disk) is retried while the others serve (`_Group`). A process whose
parent is gone stops (`stop_with_parent`). A parent removes its directory when it stops;
one killed outright (SIGKILL, the OOM killer) cannot, so its directory is named by its
pid and start time, and the next group started by the same user removes it
(`sweep_abandoned`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uvicorn.config import STARTUP_FAILURE, Config
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from gateway.api.ratelimit import SharedRateLimiter
from gateway.ingest.supervisor import WriterSupervisor

log = logging.getLogger("gateway.api")

# Where a child finds the group's directory, and the parent it signals; set by the parent.
SHARED_DIR_ENV = "GATEWAY_PROCESS_GROUP_DIR"
PARENT_ENV = "GATEWAY_PROCESS_GROUP_PARENT"
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client reads it when first imported
REPORT_EVERY_S = 0.5  # how often the parent writes the writer's state
REPORT_STALE_S = 5.0  # a report older than this: the parent stopped reporting
SNAPSHOT_EVERY_S = 1.0  # how often each process writes the series it reads of itself
PARENT_POLL_S = 0.5  # how often a process looks whether its parent is still there
RETRY_FIRST_S, RETRY_MAX_S = 2.0, 60.0  # a failed start's retry: the delay doubles up to this
GROUP_DIR_PREFIX = "gateway-serve-"
# A live group's parent touches its directory every half second (`_Group`): one untouched
# this long is not in use, even by a group whose pids this process cannot see (another
# PID namespace sharing the temporary directory).
ABANDONED_AFTER_S = 600.0
# A group's directory: its parent's pid and start time, then mkdtemp's random part.
_OWNED_DIR = re.compile(rf"{re.escape(GROUP_DIR_PREFIX)}([0-9]+)-([0-9]+)-[^/]+")


@dataclass(frozen=True)
class SharedDir:
    """The group's private directory and what lives in it."""

    root: Path
    # Held while this process counts its own series and writes them, so that an older
    # count never replaces a newer one (the scrape's thread and the event loop both write).
    lock: threading.Lock = field(default_factory=threading.Lock, compare=False)

    @property
    def metrics(self) -> Path:
        return self.root / "metrics"

    @property
    def limits(self) -> Path:
        return self.root / "limits.db"

    @property
    def writer(self) -> Path:
        return self.root / "writer.json"

    @property
    def started(self) -> Path:
        """How many of the group's processes have finished their start, as the parent saw."""
        return self.root / "processes.json"

    def processes(self) -> dict[str, int] | None:
        """{"ready": k, "of": n} from the parent's last count; None before its first."""
        try:
            count = json.loads(self.started.read_text())
            return {"ready": int(count["ready"]), "of": int(count["of"])}
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def own_snapshot(self) -> Path:
        """Named by pid and start time: a later process given the same pid is another."""
        return self.root / f"scraped-{os.getpid()}-{_start_of(os.getpid())}.json"

    def reloaded_here(self) -> Path:
        """The marker a process leaves when it asks the others to reload (it just did)."""
        return self.root / f"reloaded-{os.getpid()}"

    @classmethod
    def make(cls) -> SharedDir:
        sweep_abandoned()
        started = _start_of(os.getpid())
        owner = f"{os.getpid()}-{started}-" if started is not None else ""
        shared = cls(Path(tempfile.mkdtemp(prefix=f"{GROUP_DIR_PREFIX}{owner}")))  # mode 0700
        shared.metrics.mkdir()
        SharedRateLimiter(shared.limits).close()  # made once, before any process opens it
        return shared

    @classmethod
    def of_this_process(cls) -> SharedDir | None:
        """The group's directory when this process is one of a group's, else None."""
        root = os.environ.get(SHARED_DIR_ENV)
        return cls(Path(root)) if root else None

    def touch(self) -> None:
        """Mark the directory in use (`sweep_abandoned` spares what was touched lately)."""
        try:
            os.utime(self.root)
        except OSError as exc:  # the group serves on; the next turn touches it again
            log.warning("the group's directory cannot be touched (%s)", type(exc).__name__)

    def write_json(self, path: Path, value: Mapping[str, Any]) -> None:
        """Replaced whole (a reader never sees half a file)."""
        partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        partial.write_text(json.dumps(value))
        partial.replace(path)

    def sibling_snapshots(self) -> list[tuple[dict[str, Any], bool]]:
        """The last snapshot of every other process the group has run, and whether that
        process still runs (a dead one's counters still count; its gauges do not)."""
        found, own = [], self.own_snapshot()
        for path in self.root.glob("scraped-*.json"):
            if path == own:
                continue
            pid, _, start = path.stem.removeprefix("scraped-").partition("-")
            try:
                found.append((json.loads(path.read_text()), _start_of(int(pid)) == start))
            except (OSError, ValueError):
                continue
        return found


def sweep_abandoned(where: Path | None = None) -> list[Path]:
    """Remove the directories of groups whose parent is gone (it was killed before it
    could remove its own), in `where` (the temporary directory): only this user's, only
    those named with a pid and start time, only when no process of that pid started then
    is alive, and only when untouched for ABANDONED_AFTER_S. Returns what it removed."""
    if not hasattr(os, "getuid") or not Path("/proc/self/stat").exists():
        return []  # no way to tell a live parent from one that is gone
    removed = []
    stale_before = time.time() - ABANDONED_AFTER_S
    for entry in Path(where or tempfile.gettempdir()).glob(f"{GROUP_DIR_PREFIX}*"):
        owned = _OWNED_DIR.fullmatch(entry.name)
        try:
            found = entry.lstat()
        except OSError:
            continue
        mine = found.st_uid == os.getuid() and stat.S_ISDIR(found.st_mode)  # not a link
        if owned is None or not mine or found.st_mtime > stale_before:
            continue
        if not _gone(int(owned[1]), owned[2]):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        if not os.path.lexists(entry):
            removed.append(entry)
    if removed:
        log.info("removed %d directories of process groups whose parent is gone", len(removed))
    return removed


def _gone(pid: int, started: str) -> bool:
    """Whether no process `pid` that started at `started` is alive: its /proc entry is
    absent, it is a zombie, or another process has the pid now. False when /proc cannot
    be read for another reason (no permission): it may be alive."""
    try:
        fields = _stat_fields(pid)
    except (FileNotFoundError, ProcessLookupError):
        return True
    except (OSError, IndexError):
        return False
    return fields[0] == "Z" or fields[19] != started


def _start_of(pid: int) -> str | None:
    """When a process started (clock ticks since boot, Linux /proc); None once it is gone
    or a zombie."""
    try:
        fields = _stat_fields(pid)
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command's name (which may hold spaces and
    parentheses): the state first, the start time 20th."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


class WriterReport:
    """The writer's liveness as the group's parent reports it, for a child's `/readyz` and
    `/metrics`: the same questions a `WriterSupervisor` answers in its own process."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def _read(self) -> dict[str, Any] | None:
        try:
            report: dict[str, Any] = json.loads(self._path.read_text())
        except (OSError, ValueError):
            return None
        if time.monotonic() - float(report.get("at", 0)) > REPORT_STALE_S:
            return None  # the parent stopped reporting: nobody restarts the writer
        return report

    @property
    def up(self) -> bool:
        report = self._read()
        return bool(report and report["up"])

    @property
    def restarts(self) -> int:
        report = self._read()
        return int(report["restarts"]) if report else 0

    def healthy(self) -> bool:
        report = self._read()
        return bool(report and report["healthy"])


class _WriterReporter:
    """The parent's thread that writes the writer's state for the children."""

    def __init__(self, shared: SharedDir, writer: WriterSupervisor) -> None:
        self._shared, self._writer = shared, writer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="writer-report", daemon=True)

    def start(self) -> None:
        self._write()  # before any child asks
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _write(self) -> None:
        writer = self._writer
        self._shared.write_json(
            self._shared.writer,
            {
                "up": writer.up,
                "restarts": writer.restarts,
                "healthy": writer.healthy(),
                "at": time.monotonic(),  # CLOCK_MONOTONIC: one clock for the host
            },
        )

    def _run(self) -> None:
        while not self._stop.wait(REPORT_EVERY_S):
            try:
                self._write()
            except OSError:
                log.exception("the writer's state could not be written for the processes")


def reload_everywhere() -> bool:
    """Ask the group's parent to pass SIGHUP to every other process (each reloads its
    policy; this one just did); False when this process is not one of a group's."""
    parent, shared = os.environ.get(PARENT_ENV), SharedDir.of_this_process()
    if not parent or shared is None or os.getppid() != int(parent):
        return False  # not a group's child, or its parent is gone
    shared.reloaded_here().touch()  # the parent skips this process
    os.kill(int(parent), signal.SIGHUP)
    return True


def stop_with_parent(interval_s: float = PARENT_POLL_S) -> None:
    """In a group's process: stop (SIGTERM to itself, a graceful shutdown) once the parent
    is gone, instead of serving on unsupervised, with a writer nobody restarts."""
    parent = int(os.environ[PARENT_ENV])

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        log.error("the parent of this process is gone; stopping")
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class _Group(Multiprocess):
    """uvicorn's supervisor of the processes, with the gateway's answers to two events.

    - SIGHUP: uvicorn replaces every process; here each reloads its policy in place. A
      process starts with SIGHUP blocked (the mask survives the spawn), so one sent while
      it starts waits for its handler (`reload_on_sighup`) instead of killing it.
    - A process that dies without finishing its start: uvicorn stops the whole group (a
      bad app would fail every start), or starts it again at once. Here a policy refused
      on disk, or a process killed for memory, must neither take the processes still
      serving with it nor loop: the start is tried again after a delay that doubles. Only
      a failed start (STARTUP_FAILURE) before any process has served stops the group.
    A process that dies after its start is replaced at once.
    """

    def __init__(self, config: Config, sockets: list[socket.socket], shared: SharedDir) -> None:
        super().__init__(config, sockets)
        self.shared = shared
        self.served = False  # some process has finished its start
        self.failed = False  # the group stopped because no process could start
        self._ready: set[int] = set()  # pids seen to finish their start
        self._counted: tuple[int, int] | None = None  # the last (ready, of) written
        self._waiting: dict[int, float] = {}  # index -> when its next start is due
        self._delay: dict[int, float] = {}  # index -> the delay after its next failed start

    def init_processes(self) -> None:
        self._count()  # {0, N} before any process could answer /readyz without it
        self.processes = [self._started() for _ in range(self.processes_num)]

    def handle_ttin(self) -> None:
        log.info("SIGTTIN: one more process")
        self.processes_num += 1
        self.processes.append(self._started())

    def handle_ttou(self) -> None:
        """One process fewer (the last), and nothing kept of it: a later one at its place
        neither waits out its retry delay nor counts as started by its pid."""
        last, pid = len(self.processes) - 1, self.processes[-1].pid
        super().handle_ttou()
        if len(self.processes) == last:  # it went (one process is never taken away)
            self._waiting.pop(last, None)
            self._delay.pop(last, None)
            self._ready.discard(pid or 0)

    def _started(self) -> Process:
        process = Process(self.config, self.sockets)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
        try:
            process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return process

    def handle_hup(self) -> None:
        skipped = set()
        for marker in self.shared.root.glob("reloaded-*"):
            skipped.add(int(marker.name.removeprefix("reloaded-")))
            marker.unlink(missing_ok=True)
        log.info("SIGHUP: every process reloads its policy")
        for process in self.processes:
            if process.pid is not None and process.pid not in skipped and process.exitcode is None:
                os.kill(process.pid, signal.SIGHUP)

    def keep_subprocess_alive(self) -> None:
        if self.should_exit.is_set():
            return
        self.shared.touch()
        timeout = self.config.timeout_worker_healthcheck
        dead = []
        for index, process in enumerate(self.processes):  # first who serves, then the dead
            if index in self._waiting:
                dead.append(index)  # gone already, its next start not yet due
            elif not process.is_alive(timeout=timeout):
                process.kill()  # hung, or gone: make sure
                process.join()
                dead.append(index)
            elif process.pid not in self._ready and process.is_ready(timeout=timeout):
                self._ready.add(process.pid or 0)
                self.served = True
                self._delay.pop(index, None)  # a start that worked: the delay starts over
        for index in dead:
            if not self._replace(index):
                return
        self._count()

    def _count(self) -> None:
        """The processes that have finished their start and still run, for `/readyz`: the
        group serves from the first, and an operator sees one that keeps failing."""
        alive = {p.pid for i, p in enumerate(self.processes) if i not in self._waiting}
        counted = (len(self._ready & alive), self.processes_num)
        if counted == self._counted:
            return
        try:
            self.shared.write_json(self.shared.started, {"ready": counted[0], "of": counted[1]})
        except OSError as exc:  # the group serves on; the next turn writes it again
            log.warning("the count of started processes cannot be written (%s)", type(exc).__name__)
            return
        self._counted = counted

    def _replace(self, index: int) -> bool:
        """Start the dead process at `index` again, now or once its delay is over; False
        when the group must stop instead."""
        process, now = self.processes[index], time.monotonic()
        if index in self._waiting:
            if now < self._waiting[index]:
                return True
            del self._waiting[index]
        elif process.pid in self._ready:  # it served, then died: replaced at once
            self._ready.discard(process.pid or 0)
            log.error("process %s died (%s); starting another", process.pid, process.exitcode)
        elif process.exitcode == STARTUP_FAILURE and not self.served:
            log.error("process %s failed to start and none has started; stopping", process.pid)
            self.failed = True
            self.should_exit.set()
            return False
        else:  # it never finished its start: a policy refused on disk, memory, a crash
            delay = self._delay.get(index, RETRY_FIRST_S)
            self._delay[index] = min(RETRY_MAX_S, delay * 2)
            self._waiting[index] = now + delay
            log.error(
                "process %s failed to start (%s); trying again in %.0f s",
                process.pid,
                process.exitcode,
                delay,
            )
            return True
        self.processes[index] = self._started()
        return True


def run_processes(
    factory: str,
    host: str,
    port: int,
    processes: int,
    data_dir: Path | None,
    writer: WriterSupervisor | None,
) -> int:
    """Serve `processes` copies of the app, each built by `factory` ("module:function",
    called with no arguments in each process, from the environment), on one socket until
    stopped, with `writer` run here and reported to them. Returns the exit status:
    STARTUP_FAILURE when no process could start, as one process's server exits."""
    from gateway.api.protocol import BoundedHeadProtocol, log_config

    shared = SharedDir.make()
    os.environ.update(
        {
            SHARED_DIR_ENV: str(shared.root),
            PARENT_ENV: str(os.getpid()),
            METRICS_ENV: str(shared.metrics),
        }
    )
    if data_dir is not None:
        os.environ["GATEWAY_DATA_DIR"] = str(data_dir)  # as --data-dir said, for the children
    config = Config(
        factory,
        factory=True,
        host=host,
        port=port,
        workers=processes,
        loop="uvloop",
        http=BoundedHeadProtocol,
        log_config=log_config(),
    )
    reporter = _WriterReporter(shared, writer) if writer is not None else None
    if writer is not None:
        writer.start()
    if reporter is not None:
        reporter.start()
    try:
        group = _Group(config, [config.bind_socket()], shared)
        group.run()
        return STARTUP_FAILURE if group.failed else 0
    finally:
        if reporter is not None:
            reporter.stop()
        if writer is not None:
            writer.stop()
        shutil.rmtree(shared.root, ignore_errors=True)
