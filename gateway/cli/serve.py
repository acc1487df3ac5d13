"""Commands that serve the HTTP API: `serve` for a deployment, `demo` for a newcomer."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gateway.cli.options import DataDirOption, fail, one_blas_thread, settings_from_env


def serve(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8080,
    data_dir: DataDirOption = None,
) -> None:
    """Serve the HTTP API (identity, storage and policy from GATEWAY_* settings)."""
    from gateway.api.app import create_app

    settings = settings_from_env(data_dir)
    if not settings.dev_issuer and (not settings.oidc_issuer or not settings.oidc_audience):
        fail("GATEWAY_OIDC_ISSUER and GATEWAY_OIDC_AUDIENCE must be set")
    _run_server(create_app(settings), host, port)


def _run_server(app: Any, host: str, port: int) -> None:
    from gateway.api.protocol import run_server

    one_blas_thread()
    run_server(app, host, port)


def demo(
    port: Annotated[int, typer.Option(help="TCP port on 127.0.0.1.")] = 8080,
    data_dir: Annotated[
        Path, typer.Option("--data-dir", help="Where the demo keeps its index and issuer.")
    ] = Path("demo-data"),
) -> None:
    """Ingest the Northwind demo corpus, print tokens and curl commands, serve on loopback."""
    from gateway.api.app import create_app
    from gateway.authn.devissuer import ensure_dev_issuer
    from gateway.demo import run
    from gateway.embedding import Embedder

    embedder = Embedder()
    report = run.prepare_data(data_dir, embedder, progress=sys.stderr.isatty())
    if report is not None:
        typer.echo(
            f"ingested the demo corpus: {report.documents} documents, {report.chunks} chunks, "
            f"{report.revised} superseded versions closed ({report.seconds:.1f} s)"
        )
    settings = run.demo_settings(settings_from_env(), data_dir)
    tokens = run.mint_tokens(ensure_dev_issuer(data_dir))
    env_file = run.write_env(data_dir, tokens)
    typer.echo(run.instructions(f"http://{run.HOST}:{port}", tokens, env_file))
    _run_server(create_app(settings, embedder=embedder), run.HOST, port)
