"""`gateway bench`: a real server under load, measured over HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gateway.cli.options import fail, settings_from_env
from gateway.errors import GatewayError


def bench(
    chunks: Annotated[int, typer.Option(min=1, help="Synthetic corpus size.")] = 200_000,
    queries: Annotated[int, typer.Option(min=1, help="Queries per endpoint.")] = 200,
    concurrency: Annotated[int, typer.Option(min=1, max=64, help="Client threads.")] = 1,
    selectivity: Annotated[
        float,
        typer.Option(
            min=0.001, max=1.0, help="Share of the corpus the caller may see (0.01, 0.1, 1.0)."
        ),
    ] = 0.1,
    synthetic: Annotated[
        bool, typer.Option("--synthetic", help="Generated corpus (the default without --corpus).")
    ] = False,
    corpus: Annotated[
        Path | None, typer.Option(help="JSONL documents to benchmark on instead.")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the report as JSON.")
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help="The bench's own data dir, built or reused; a scratch dir by default.",
        ),
    ] = None,
    processes: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=64,
            help="Processes the measured server answers from (overrides GATEWAY_SERVE_PROCESSES).",
        ),
    ] = None,
) -> None:
    """Build or reuse a benchmark corpus, serve it for real and measure over HTTP: latency
    per endpoint and stage, throughput, errors, degraded lanes, dense recall, memory,
    startup and ingest rate. Targets are reported, not enforced."""
    from gateway.bench.runner import BenchOptions, run_bench
    from gateway.ingest.parse import DocumentsRefused
    from gateway.placement import Placement

    if synthetic and corpus is not None:
        fail("bench: --synthetic and --corpus exclude each other")
    if corpus is not None and not corpus.is_file():
        fail(f"bench: no such file: {corpus}")
    settings = settings_from_env()
    options = BenchOptions(
        chunks=chunks,
        queries=queries,
        concurrency=concurrency,
        selectivity=selectivity,
        corpus=corpus,
        json_out=json_out,
        data_dir=data_dir,
        policy_dir=settings.policy_dir,
        precision=settings.embedding_precision,
        model_cache_dir=settings.model_cache_dir,
        processes=processes or settings.serve_processes,
        lane_cpus=Placement.plan(
            settings.lane_cpus, alone=(processes or settings.serve_processes) == 1
        ).kind,
    )
    try:
        run_bench(options, typer.echo)
    except DocumentsRefused as exc:  # each problem on its line, as `gateway ingest` says them
        fail(f"bench: refused, nothing was ingested:\n{exc}")
    except (ValueError, OSError, RuntimeError) as exc:
        fail(f"bench: {exc}")
    except GatewayError as exc:
        fail(f"bench: {exc.code}: {exc.detail}")
