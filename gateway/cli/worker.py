"""`gateway worker`: the writer that turns queued ingest jobs into generations.

`gateway serve` starts one beside itself unless `--no-worker`. It runs at a lower CPU
priority than the server (nice 10): on a small machine the writer embeds in the time
requests leave over, so searches keep their budgets while a push is written.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from gateway.cli.options import DataDirOption, fail, layout_of, settings_from_env
from gateway.errors import GatewayError
from gateway.settings import Settings

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.ingest.worker import IngestWorker
    from gateway.policy.model import Policy
    from gateway.storage.layout import DataLayout

NICENESS = 10
LEASE_POLL_S = 1.0  # how often a waiting writer tries the lease
STOP_WAIT_S = 30.0

log = logging.getLogger("gateway.worker")


def worker(
    data_dir: DataDirOption = None,
    exit_with_parent: Annotated[
        int | None, typer.Option(hidden=True, help="Stop when this process is gone.")
    ] = None,
    embed_only: Annotated[
        bool,
        typer.Option(
            "--embed-only",
            help="Only embed slices of queued jobs and hand them to the writer (any number, "
            "any host); never commit.",
        ),
    ] = False,
) -> None:
    """Write queued ingest jobs as generations, in order, until stopped (SIGTERM, Ctrl-C).
    One writer per deployment holds the lease; another waits, and takes over when the
    first stops or dies. With --embed-only, embed for the writer instead."""
    from gateway.embedding import Embedder
    from gateway.embedding.precision import log_choice
    from gateway.ingest.worker import IngestWorker, exit_with
    from gateway.policy.store import PolicyStore
    from gateway.storage.catalog import open_engine
    from gateway.storage.layout import check_model
    from gateway.storage.lease import WriterLease

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = settings_from_env(data_dir)
    os.nice(NICENESS)
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True  # the job being written is finished first

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    parent_gone = exit_with(exit_with_parent)
    try:
        policies = PolicyStore(settings.policy_dir)
    except GatewayError as exc:  # as `ingest` says it: an operator never saw why
        fail(f"{exc.code}: {exc.detail}")
    layout = layout_of(settings)

    def policy() -> Policy:
        policies.reload_if_changed()
        return policies.current.policy

    if embed_only:
        _embed_only(settings, layout, policy, lambda: stopping or parent_gone())
        return
    lease = WriterLease(open_engine(layout.catalog_url), layout.root)
    writer: IngestWorker | None = None
    waiting = False
    while not (stopping or parent_gone()):
        try:
            taken = lease.try_acquire()
        except GatewayError:  # the catalog cannot be reached: try again
            taken = False
        if not taken:
            if not waiting:
                log.info("another writer holds the lease for %s; waiting", layout.root)
                waiting = True
            time.sleep(LEASE_POLL_S)
            continue
        try:
            writer = writer or IngestWorker(
                layout,
                Embedder(
                    threads=settings.embedding_threads, precision=settings.embedding_precision
                ),
                policy,
                claim_timeout_s=settings.embed_claim_timeout_s,
            )  # loaded once
            embedder = writer.embedder
            current = writer.catalog.current_generation()
            if current is not None:  # invariant 12: refuse at start, not by failing each job
                check_model(current, embedder.name, embedder.dim)
            log_choice(log, embedder.numerics)
            # Torch loads now, not inside the first job: a model that cannot load stops the
            # writer here (the server then says it is not ready), instead of failing jobs.
            embedder.embed(["warm up"])
            writer.resume()
            log.info("writer ready for %s", layout.root)
            writer.run(lambda: stopping or parent_gone() or not lease.held(), lease.held)
        except GatewayError as exc:
            # Outside `run`, which waits out the rest, only the catalog is transient;
            # catalog_outdated, index_mismatch: say why, and stop (as --embed-only does).
            if not exc.transient:
                fail(f"{exc.code}: {exc.detail}")
            log.warning("the catalog cannot be reached; taking the lease again when it can")
        finally:
            lease.release()


def _embed_only(
    settings: Settings, layout: DataLayout, policy: Callable[[], Policy], stop: Callable[[], bool]
) -> None:
    from gateway.embedding import Embedder
    from gateway.embedding.precision import log_choice
    from gateway.ingest.embedder import EmbedOnly

    embedder = Embedder(threads=settings.embedding_threads, precision=settings.embedding_precision)
    while True:  # invariant 12: refuse at start, not per slice
        try:
            loop = EmbedOnly(
                layout.open_catalog(), embedder, policy, settings.embed_claim_timeout_s
            )
            loop.check_model()
            break
        except GatewayError as exc:
            if not exc.transient:  # index_mismatch, catalog_outdated: say why, and stop
                fail(f"{exc.code}: {exc.detail}")
            if stop():
                return
            log.warning("%s (%s); retrying", exc.code, exc.detail)  # away for a moment
            time.sleep(LEASE_POLL_S)
    log_choice(log, loop.embedder.numerics)
    loop.embedder.embed(["warm up"])  # torch loads before a claim is held, not during one
    log.info("embedder ready (%s)", loop.embedder.numerics.label)
    loop.run(stop)


def start_worker(settings: Settings) -> subprocess.Popen[bytes]:
    """A writer for `settings`' data dir, as a child process that stops with this one."""
    env = {**os.environ, "GATEWAY_DATA_DIR": str(settings.data_dir)}
    if settings.policy_dir is not None:
        env["GATEWAY_POLICY_DIR"] = str(settings.policy_dir)
    command = [sys.executable, "-m", "gateway", "worker", "--exit-with-parent", str(os.getpid())]
    return subprocess.Popen(command, env=env)


def stop_worker(process: subprocess.Popen[bytes]) -> None:
    """Ask the writer to stop after its current job; kill it if it takes too long (its job
    is then resumed by the next writer)."""
    process.terminate()
    try:
        process.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
