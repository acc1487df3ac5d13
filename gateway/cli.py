"""The `gateway` command: ingest, serve, demo, policy tools and API keys."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError

from gateway.errors import GatewayError
from gateway.settings import Settings

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
policy_app = typer.Typer(no_args_is_help=True, help="Policy tools.")
app.add_typer(policy_app, name="policy")
keys_app = typer.Typer(no_args_is_help=True, help="API keys for service callers.")
app.add_typer(keys_app, name="keys")

DataDirOption = Annotated[
    Path | None, typer.Option("--data-dir", help="Overrides GATEWAY_DATA_DIR.")
]
# Large enough for a 32 KiB bearer token plus the other headers.
MAX_HEADER_BYTES = 64 * 1024


def _settings(data_dir: Path | None = None) -> Settings:
    """Settings from the environment; a bad value ends the command with its name and why."""
    try:
        settings = Settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        _fail(f"invalid settings: {problems}")
    return settings.model_copy(update={"data_dir": data_dir}) if data_dir else settings


def _fail(message: str) -> NoReturn:
    typer.echo(message, err=True)
    raise typer.Exit(code=1)


@app.command()
def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Files (.md .txt .jsonl) or directories.")],
    data_dir: DataDirOption = None,
) -> None:
    """Validate, chunk, embed and index documents as one new generation (all or nothing)."""
    from gateway.embedding import Embedder
    from gateway.ingest.parse import DocumentsRefused, load_documents
    from gateway.ingest.pipeline import ingest_documents
    from gateway.storage.generations import DataLayout

    settings = _settings(data_dir)
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        _fail(f"no such file or directory: {', '.join(missing)}")
    try:
        documents = load_documents(paths)  # refuse bad input before loading the model
        report = ingest_documents(
            documents, DataLayout(settings.data_dir), Embedder(), progress=sys.stderr.isatty()
        )
    except DocumentsRefused as exc:
        _fail(f"refused, nothing was ingested:\n{exc}")
    except GatewayError as exc:
        _fail(f"{exc.code}: {exc.detail}")
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

    settings = _settings(data_dir)
    if not settings.dev_issuer and (not settings.oidc_issuer or not settings.oidc_audience):
        _fail("GATEWAY_OIDC_ISSUER and GATEWAY_OIDC_AUDIENCE must be set")
    _run_server(create_app(settings), host, port)


def _run_server(app: Any, host: str, port: int) -> None:
    import uvicorn

    uvicorn.run(app, host=host, port=port, h11_max_incomplete_event_size=MAX_HEADER_BYTES)


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
    settings = run.demo_settings(_settings(), data_dir)
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
    """Score BM25, dense and fused retrieval on a BEIR benchmark; run release-gate cases."""
    import datetime as dt

    from gateway.evaluation.beir import BenchmarkError
    from gateway.evaluation.command import EvalOptions, run_eval
    from gateway.evaluation.run import Scope

    try:
        scope = Scope(
            tenant, region, tuple(acl or ["group:eval"]), dt.date.fromisoformat(effective_from)
        )
        options = EvalOptions(
            corpus, queries, qrels, cases, scope, data_dir, _settings().policy_dir, json_out
        )
        status = run_eval(options, typer.echo)
    except (BenchmarkError, ValueError, OSError) as exc:
        _fail(f"eval: {exc}")
    except GatewayError as exc:
        _fail(f"eval: {exc.code}: {exc.detail}")
    raise typer.Exit(code=status)


@policy_app.command("check")
def policy_check(
    directory: Annotated[Path | None, typer.Argument(help="Policy directory.")] = None,
) -> None:
    """Validate a policy directory; exits non-zero on any problem."""
    from gateway.policy.loader import load_policy

    settings = _settings()
    try:
        loaded = load_policy(directory or settings.policy_dir)
    except GatewayError as exc:
        _fail(f"invalid policy: {exc.detail}")
    typer.echo(f"policy ok: version {loaded.version} ({', '.join(loaded.files)})")


@policy_app.command("schema")
def policy_schema() -> None:
    """Print the JSON schema of policy files (checked in as policies/schema.json)."""
    from gateway.policy.loader import policy_schema as render

    typer.echo(render(), nl=False)


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="The only tenant the key reads.")],
    region: Annotated[str, typer.Option(help="The key's region (policy region rules apply).")],
    principal: Annotated[
        list[str], typer.Option(help="A principal the key holds, e.g. group:search-bot; repeat.")
    ],
    name: Annotated[str, typer.Option(help="What the key is for, shown by `keys list`.")] = "",
    expires_days: Annotated[
        int | None, typer.Option(help="Days until the key stops working; never by default.")
    ] = None,
    data_dir: DataDirOption = None,
) -> None:
    """Create a key scoped to exactly this tenant, region and these principals; prints it once."""
    from gateway.authn.apikeys import create_key
    from gateway.storage.generations import DataLayout

    catalog = DataLayout(_settings(data_dir).data_dir).open_catalog()
    try:
        token, row = create_key(
            catalog,
            tenant=tenant,
            region=region,
            principals=principal,
            name=name,
            expires_days=expires_days,
        )
    except ValueError as exc:
        _fail(f"key not created: {exc}")
    typer.echo(f"created key {row.key_id}; it is shown once, store it now:\n{token}")


@keys_app.command("list")
def keys_list(data_dir: DataDirOption = None) -> None:
    """Every key with its scope and state; never a secret."""
    from gateway.storage.generations import DataLayout

    rows = DataLayout(_settings(data_dir).data_dir).open_catalog().api_keys()
    typer.echo("key_id            state    tenant  region  principals  name  created  expires")
    for r in rows:
        state = "revoked" if r.revoked_at else "active"
        expires = r.expires_at.date().isoformat() if r.expires_at else "never"
        typer.echo(
            f"{r.key_id}  {state:7}  {r.tenant}  {r.region}  {','.join(r.principals)}  "
            f"{r.name or '-'}  {r.created_at.date().isoformat()}  {expires}"
        )


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key's ID, as `keys list` shows it.")],
    data_dir: DataDirOption = None,
) -> None:
    """Revoke a key: the next request made with it is refused."""
    import datetime as dt

    from gateway.storage.generations import DataLayout

    catalog = DataLayout(_settings(data_dir).data_dir).open_catalog()
    row = catalog.revoke_api_key(key_id, dt.datetime.now(dt.UTC))
    if row is None:
        _fail(f"no key {key_id!r}")
    typer.echo(f"key {key_id} revoked at {row.revoked_at}")
