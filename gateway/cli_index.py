"""Index maintenance while the server runs: delete, ACL changes, re-embedding.

Each command writes one new generation; a running server serves it from the next request
on, and never sees half of it.
"""

from __future__ import annotations

from typing import Annotated

import typer

from gateway.cli_support import DataDirOption, fail, settings_from_env
from gateway.errors import GatewayError
from gateway.ingest.generation import GenerationReport

acl_app = typer.Typer(no_args_is_help=True, help="Access control lists of indexed documents.")


def _say(report: GenerationReport | None, what: str) -> None:
    if report is None:
        typer.echo(f"{what}: nothing to change")
    else:
        typer.echo(f"generation {report.generation}: {what} ({report.seconds:.1f} s)")


def delete(
    doc_id: Annotated[str, typer.Argument(help="The document to remove.")],
    version: Annotated[str | None, typer.Option(help="Only this version.")] = None,
    data_dir: DataDirOption = None,
) -> None:
    """Remove a document (every version, or one); a version it had closed is reopened."""
    from gateway.ingest.pipeline import delete_versions
    from gateway.storage.generations import DataLayout

    layout = DataLayout(settings_from_env(data_dir).data_dir)
    try:
        report = delete_versions(layout, doc_id, version)
    except GatewayError as exc:
        fail(f"{exc.code}: {exc.detail}")
    _say(report, f"deleted {report.deleted} version(s) of {doc_id}")


@acl_app.command("set")
def acl_set(
    doc_id: Annotated[str, typer.Argument(help="The document whose ACL is replaced.")],
    acl: Annotated[list[str], typer.Option(help="A principal that may read it; repeat.")],
    version: Annotated[str | None, typer.Option(help="Only this version.")] = None,
    data_dir: DataDirOption = None,
) -> None:
    """Replace a document's ACL without re-embedding; effective for the next request."""
    from gateway.ingest.pipeline import set_acl
    from gateway.storage.generations import DataLayout

    layout = DataLayout(settings_from_env(data_dir).data_dir)
    try:
        report = set_acl(layout, doc_id, acl, version)
    except GatewayError as exc:
        fail(f"{exc.code}: {exc.detail}")
    _say(report, f"ACL of {doc_id} set to {', '.join(acl)}")


def reindex(data_dir: DataDirOption = None) -> None:
    """Embed every document again with the configured model, into a fresh index."""
    import sys

    from gateway.embedding import Embedder
    from gateway.ingest.pipeline import reindex as reindex_all
    from gateway.policy.loader import load_policy
    from gateway.storage.generations import DataLayout

    settings = settings_from_env(data_dir)
    layout = DataLayout(settings.data_dir)
    try:
        policy = load_policy(settings.policy_dir).policy
        report = reindex_all(
            layout,
            Embedder(),
            policy.chunking,
            progress=sys.stderr.isatty(),
            ann_min_rows=policy.retrieval.ann_min_rows,
        )
    except GatewayError as exc:
        fail(f"{exc.code}: {exc.detail}")
    _say(report, f"re-embedded {report.documents} versions, {report.chunks} chunks")
