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
  `POST /admin/policy/reload` sends it, so every process reloads, not only the one asked;
- the writer's liveness: the parent runs the writer and writes its state for every
  process's `/readyz` and `/metrics` (`WriterReport`).

What stays each process's own: `limits.retrievals_per_tenant` (it bounds the lanes of the
process that runs them), the audit writer (each commits its own records), the caches.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.ingest.supervisor import WriterSupervisor

log = logging.getLogger("gateway.api")

# Where a child finds the group's directory, and the parent it signals; set by the parent.
SHARED_DIR_ENV = "GATEWAY_PROCESS_GROUP_DIR"
PARENT_ENV = "GATEWAY_PROCESS_GROUP_PARENT"
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client reads it when first imported
REPORT_EVERY_S = 0.5  # how often the parent writes the writer's state
REPORT_STALE_S = 5.0  # a report older than this: the parent stopped reporting
SNAPSHOT_EVERY_S = 1.0  # how often each process writes the series it reads of itself


@dataclass(frozen=True)
class SharedDir:
    """The group's private directory and what lives in it."""

    root: Path

    @property
    def metrics(self) -> Path:
        return self.root / "metrics"

    @property
    def limits(self) -> Path:
        return self.root / "limits.db"

    @property
    def writer(self) -> Path:
        return self.root / "writer.json"

    def snapshot(self, pid: int) -> Path:
        return self.root / f"scraped-{pid}.json"

    @classmethod
    def make(cls) -> SharedDir:
        shared = cls(Path(tempfile.mkdtemp(prefix="gateway-serve-")))  # mode 0700
        shared.metrics.mkdir()
        return shared

    @classmethod
    def of_this_process(cls) -> SharedDir | None:
        """The group's directory when this process is one of a group's, else None."""
        root = os.environ.get(SHARED_DIR_ENV)
        return cls(Path(root)) if root else None

    def write_json(self, path: Path, value: Mapping[str, Any]) -> None:
        """Replaced whole (a reader never sees half a file)."""
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(json.dumps(value))
        partial.replace(path)

    def sibling_snapshots(self) -> list[dict[str, Any]]:
        """The last snapshot of every other live process of the group."""
        found = []
        for path in self.root.glob("scraped-*.json"):
            pid = int(path.stem.removeprefix("scraped-"))
            if pid == os.getpid() or not _alive(pid):
                continue
            try:
                found.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue  # gone meanwhile (the process exited)
        return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        if time.time() - float(report.get("at", 0)) > REPORT_STALE_S:
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
                "at": time.time(),
            },
        )

    def _run(self) -> None:
        while not self._stop.wait(REPORT_EVERY_S):
            try:
                self._write()
            except OSError:
                log.exception("the writer's state could not be written for the processes")


def reload_everywhere() -> bool:
    """Ask the group's parent to pass SIGHUP to every process (each reloads its policy);
    False when this process is not one of a group's."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or os.getppid() != int(parent):
        return False  # not a group's child, or its parent is gone
    os.kill(int(parent), signal.SIGHUP)
    return True


def run_processes(
    factory: str,
    host: str,
    port: int,
    processes: int,
    data_dir: Path | None,
    writer: WriterSupervisor | None,
) -> None:
    """Serve `processes` copies of the app, each built by `factory` ("module:function",
    called with no arguments in each process, from the environment), on one socket until
    stopped, with `writer` run here and reported to them."""
    from uvicorn import Config
    from uvicorn.supervisors.multiprocess import Multiprocess

    from gateway.api.protocol import BoundedHeadProtocol, log_config

    class Group(Multiprocess):
        def handle_hup(self) -> None:
            # uvicorn restarts every process on SIGHUP; a policy reload is cheaper in
            # place, and a refused policy must not stop a process from coming back.
            log.info("SIGHUP: every process reloads its policy")
            for process in self.processes:
                if process.pid is not None:
                    os.kill(process.pid, signal.SIGHUP)

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
        Group(config, sockets=[config.bind_socket()]).run()
    finally:
        if reporter is not None:
            reporter.stop()
        if writer is not None:
            writer.stop()
        shutil.rmtree(shared.root, ignore_errors=True)
