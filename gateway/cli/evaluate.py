"""`gateway eval`: retrieval and answer quality, and release-gate cases."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gateway.cli.options import fail, one_blas_thread, settings_from_env, short_gil_turns
from gateway.errors import GatewayError


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
        typer.Option(
            "--data-dir",
            help="Index to build or reuse: with --corpus, a new dir or one eval made (never a "
            "served data dir); a scratch dir by default.",
        ),
    ] = None,
) -> None:
    """Score BM25, dense and fused retrieval on a BEIR benchmark, or answers and abstention
    on SQuAD-style questions; run release-gate cases."""
    import datetime as dt

    from gateway.evaluation.beir import BenchmarkError
    from gateway.evaluation.retrieval import Scope
    from gateway.evaluation.runner import EvalOptions, run_eval

    one_blas_thread()  # searches as the server does, so its latency figures are the server's
    short_gil_turns()
    try:
        settings = settings_from_env()
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
            settings.policy_dir,
            json_out,
            answers,
            settings.embedding_precision,
            settings.model_cache_dir,
        )
        status = run_eval(options, typer.echo)
    except (BenchmarkError, ValueError, OSError) as exc:
        fail(f"eval: {exc}")
    except GatewayError as exc:
        fail(f"eval: {exc.code}: {exc.detail}")
    raise typer.Exit(code=status)
