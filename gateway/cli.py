"""The `gateway` command: ingest, serve, demo, eval, bench, and admin and operator tools."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gateway.cli_index import acl_app, delete, reindex
from gateway.cli_keys import keys_app
from gateway.cli_support import DataDirOption, fail, one_blas_thread, settings_from_env
from gateway.errors import GatewayError

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
policy_app = typer.Typer(no_args_is_help=True, help="Policy tools.")
app.add_typer(policy_app, name="policy")
app.add_typer(keys_app, name="keys")


@app.command()
def ingest(
    paths: Annotated[
        list[Path], typer.Argument(help="Files (.md .txt .jsonl .html .pdf) or directories.")
    ],
    tenant: Annotated[str | None, typer.Option(help="Default tenant.")] = None,
    region: Annotated[str | None, typer.Option(help="Default region.")] = None,
    acl: Annotated[list[str] | None, typer.Option(help="Default ACL principal; repeat.")] = None,
    effective_from: Annotated[str | None, typer.Option(help="Default start, YYYY-MM-DD.")] = None,
    effective_to: Annotated[str | None, typer.Option(help="Default end, YYYY-MM-DD.")] = None,
    version: Annotated[str | None, typer.Option(help="Default version.")] = None,
    data_dir: DataDirOption = None,
) -> None:
    """Validate, chunk, embed and index documents as one new generation (all or nothing).

    Metadata options are defaults: a sidecar (<file>.meta.yaml) and the document's own
    front matter or JSONL fields override them field by field."""
    from gateway.embedding import Embedder
    from gateway.ingest.parse import DocumentsRefused
    from gateway.ingest.pipeline import ingest_documents
    from gateway.ingest.sources import load_documents
    from gateway.policy.loader import load_policy
    from gateway.storage.generations import DataLayout

    settings = settings_from_env(data_dir)
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        fail(f"no such file or directory: {', '.join(missing)}")
    try:
        policy = load_policy(settings.policy_dir).policy
        given = {
            "tenant": tenant,
            "region": region,
            "acl": acl,
            "effective_from": effective_from,
            "effective_to": effective_to,
            "version": version,
        }
        defaults = {k: v for k, v in given.items() if v is not None}
        documents = load_documents(paths, defaults)  # refuse bad input before loading the model
        layout = DataLayout(settings.data_dir)
        report = ingest_documents(
            documents,
            layout,
            Embedder(),
            policy.chunking,
            progress=sys.stderr.isatty(),
            ann_min_rows=policy.retrieval.ann_min_rows,
        )
    except DocumentsRefused as exc:
        fail(f"refused, nothing was ingested:\n{exc}")
    except GatewayError as exc:
        fail(f"{exc.code}: {exc.detail}")
    typer.echo(
        f"generation {report.generation}: {report.documents} documents, {report.chunks} chunks, "
        f"{report.revised} versions closed, {report.seconds:.1f} s "
        f"({report.chunks_per_s:.0f} chunks/s embedding)"
    )


@app.command()
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


@app.command()
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


@app.command("eval")
def evaluate(
    corpus: Annotated[
        Path | None, typer.Option(help="BEIR corpus.jsonl (_id, title, text).")
    ] = None,
    queries: Annotated[Path | None, typer.Option(help="BEIR queries.jsonl (_id, text).")] = None,
    qrels: Annotated[
        Path | None, typer.Option(help="BEIR qrels TSV (query-id, corpus-id, score).")
    ] = None,
    cases: Annotated[Path | None, typer.Option(help="YAML release-gate cases.")] = None,
    answers: Annotated[
        Path | None,
        typer.Option(
            help="Questions JSONL (id, question, answers, is_impossible, gold_passage_id): "
            "score the answer path on them (needs --corpus)."
        ),
    ] = None,
    tenant: Annotated[str, typer.Option(help="Tenant of every corpus document.")] = "eval",
    region: Annotated[str, typer.Option(help="Region of every corpus document.")] = "EVAL",
    acl: Annotated[
        list[str] | None, typer.Option(help="ACL principal of every document; repeat.")
    ] = None,
    effective_from: Annotated[
        str, typer.Option(help="effective_from of every document.")
    ] = "2000-01-01",
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the report as JSON.")
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option("--data-dir", help="Index to build or reuse; a scratch dir by default."),
    ] = None,
) -> None:
    """Score BM25, dense and fused retrieval on a BEIR benchmark, or answers and abstention
    on SQuAD-style questions; run release-gate cases."""
    import datetime as dt

    from gateway.evaluation.beir import BenchmarkError
    from gateway.evaluation.command import EvalOptions, run_eval
    from gateway.evaluation.run import Scope

    one_blas_thread()  # searches as the server does, so its latency figures are the server's
    try:
        scope = Scope(
            tenant, region, tuple(acl or ["group:eval"]), dt.date.fromisoformat(effective_from)
        )
        options = EvalOptions(
            corpus,
            queries,
            qrels,
            cases,
            scope,
            data_dir,
            settings_from_env().policy_dir,
            json_out,
            answers,
        )
        status = run_eval(options, typer.echo)
    except (BenchmarkError, ValueError, OSError) as exc:
        fail(f"eval: {exc}")
    except GatewayError as exc:
        fail(f"eval: {exc.code}: {exc.detail}")
    raise typer.Exit(code=status)


@app.command()
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
) -> None:
    """Build or reuse a benchmark corpus, serve it for real and measure over HTTP: latency
    per endpoint and stage, throughput, errors, degraded lanes, dense recall, memory,
    startup and ingest rate. Targets are reported, not enforced."""
    from gateway.bench.command import BenchOptions, run_bench

    if synthetic and corpus is not None:
        fail("bench: --synthetic and --corpus exclude each other")
    if corpus is not None and not corpus.is_file():
        fail(f"bench: no such file: {corpus}")
    options = BenchOptions(
        chunks=chunks,
        queries=queries,
        concurrency=concurrency,
        selectivity=selectivity,
        corpus=corpus,
        json_out=json_out,
        data_dir=data_dir,
        policy_dir=settings_from_env().policy_dir,
    )
    try:
        run_bench(options, typer.echo)
    except (ValueError, OSError, RuntimeError) as exc:
        fail(f"bench: {exc}")
    except GatewayError as exc:
        fail(f"bench: {exc.code}: {exc.detail}")


@policy_app.command("check")
def policy_check(
    directory: Annotated[Path | None, typer.Argument(help="Policy directory.")] = None,
) -> None:
    """Validate a policy directory; exits non-zero on any problem."""
    from gateway.policy.loader import load_policy

    settings = settings_from_env()
    try:
        loaded = load_policy(directory or settings.policy_dir)
    except GatewayError as exc:
        fail(f"invalid policy: {exc.detail}")
    typer.echo(f"policy ok: version {loaded.version} ({', '.join(loaded.files)})")


@policy_app.command("schema")
def policy_schema() -> None:
    """Print the JSON schema of policy files (checked in as policies/schema.json)."""
    from gateway.policy.loader import policy_schema as render

    typer.echo(render(), nl=False)


app.command()(delete)
app.add_typer(acl_app, name="acl")
app.command()(reindex)
