"""Commands that serve the HTTP API: `serve` for a deployment, `demo` for a newcomer."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any

import typer

from gateway.cli.options import (
    DataDirOption,
    fail,
    layout_of,
    one_blas_thread,
    settings_from_env,
    short_gil_turns,
)
from gateway.cli.worker import start_worker, stop_worker
from gateway.errors import GatewayError
from gateway.ingest.supervisor import WriterSupervisor
from gateway.settings import Settings


def serve(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.", min=1, max=65535)] = 8080,
    data_dir: DataDirOption = None,
    worker: Annotated[
        bool, typer.Option(help="Also run the writer of ingest jobs (`gateway worker`).")
    ] = True,
    processes: Annotated[
        int | None,
        typer.Option(
            min=1, max=64, help="Processes to answer from (overrides GATEWAY_SERVE_PROCESSES)."
        ),
    ] = None,
) -> None:
    """Serve the HTTP API (identity, storage and policy from GATEWAY_* settings)."""
    from gateway.api.app import create_app

    settings = settings_from_env(data_dir)
    if processes is not None:
        settings = settings.model_copy(update={"serve_processes": processes})
    if settings.dev_issuer and not is_loopback(host):
        fail(
            "GATEWAY_DEV_ISSUER is trusted only by a server bound to a loopback address "
            f"(127.0.0.1, ::1, localhost), not {host}: the demo's key is in the data dir"
        )
    if not settings.dev_issuer and (not settings.oidc_issuer or not settings.oidc_audience):
        fail("GATEWAY_OIDC_ISSUER and GATEWAY_OIDC_AUDIENCE must be set")
    from gateway.authn.devissuer import resolve_identity  # JOSE: only a server needs it

    try:
        resolve_identity(settings)  # refuses the dev issuer beside a configured one
        layout_of(settings).open_catalog()  # an out-of-date schema is named here, not in a trace
    except GatewayError as exc:
        fail(f"{exc.code}: {exc.detail}")
    writer = supervised_writer(settings) if worker else None
    if settings.serve_processes > 1:
        from gateway.api.processes import run_processes

        factory = f"{__name__}:served_app"
        status = run_processes(factory, host, port, settings.serve_processes, data_dir, writer)
        if status:
            raise typer.Exit(code=status)  # as one process's server exits when it cannot start
        return
    _run_server(create_app(settings, writer=writer, freeze_startup=True), host, port, writer)


def served_app() -> Any:
    """One process of a `serve --processes N`: the app, from the settings in the
    environment, the writer as the parent reports it, and the group's shared directory."""
    from gateway.api.app import create_app
    from gateway.api.processes import SHARED_DIR_ENV, SharedDir, WriterReport, stop_with_parent

    shared = SharedDir.of_this_process()
    if shared is None:
        raise RuntimeError(f"{SHARED_DIR_ENV} is not set: served_app serves a process group")
    stop_with_parent()
    one_blas_thread()
    short_gil_turns()
    writer = WriterReport(shared.writer) if shared.writer.exists() else None
    return create_app(settings_from_env(), writer=writer, shared=shared, freeze_startup=True)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # any other name may resolve anywhere


def supervised_writer(settings: Settings) -> WriterSupervisor:
    """A writer for `settings`' data dir, restarted whenever it dies."""
    return WriterSupervisor(lambda: start_worker(settings), stop_worker)


def _run_server(app: Any, host: str, port: int, writer: WriterSupervisor | None) -> None:
    """Serve until stopped, with `writer` (kept running) beside the server."""
    from gateway.api.protocol import run_server

    one_blas_thread()
    short_gil_turns()
    if writer is not None:
        writer.start()
    try:
        run_server(app, host, port)
    finally:
        if writer is not None:
            writer.stop()


def demo(
    port: Annotated[int, typer.Option(help="TCP port on 127.0.0.1.", min=1, max=65535)] = 8080,
    data_dir: Annotated[
        Path, typer.Option("--data-dir", help="Where the demo keeps its index and issuer.")
    ] = Path("demo-data"),
) -> None:
    """Ingest the Northwind demo corpus, print tokens and curl commands, serve on loopback."""
    from gateway.api.app import create_app
    from gateway.authn.devissuer import ensure_dev_issuer
    from gateway.demo import run
    from gateway.embedding import Embedder

    embedder = Embedder(precision=settings_from_env().embedding_precision)
    report = run.prepare_data(data_dir, embedder, progress=True)
    if report is not None:
        typer.echo(
            f"ingested the demo corpus: {report.documents} documents, {report.chunks} chunks, "
            f"{report.revised} superseded versions closed ({report.seconds:.1f} s)"
        )
    settings = run.demo_settings(settings_from_env(), data_dir)
    tokens = run.mint_tokens(ensure_dev_issuer(data_dir))
    env_file = run.write_env(data_dir, tokens)
    typer.echo(run.instructions(f"http://{run.HOST}:{port}", tokens, env_file))
    writer = supervised_writer(settings)
    _run_server(create_app(settings, embedder=embedder, writer=writer), run.HOST, port, writer)
