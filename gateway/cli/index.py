"""Commands that change the index: ingest, delete, ACL changes, re-embedding.

Each writes one new generation; a running server serves it from the next request on, and
never sees half of it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gateway.cli.options import DataDirOption, fail, layout_of, settings_from_env
from gateway.errors import GatewayError

if TYPE_CHECKING:  # the writer imports the engines: keep `gateway --help` instant
    from gateway.embedding import Embedder
    from gateway.ingest.writer import GenerationReport
    from gateway.storage.layout import DataLayout


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
    from gateway.ingest.sources import SUFFIXES, load_documents
    from gateway.policy.loader import load_policy

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
        skipped: list[Path] = []  # links out of a folder: named, never read
        linked: list[Path] = []  # links to files in the folder: read there, as themselves
        # Refuse bad input before loading the model.
        documents = load_documents(paths, defaults, skipped=skipped, linked=linked)
        for path in skipped:
            typer.echo(f"skipped {path}: a link to a place outside the folder, not read", err=True)
        for path in linked:
            typer.echo(
                f"skipped {path}: a link to a file in the folder, read there under its own name",
                err=True,
            )
        if not documents:
            # Ingest adds and replaces versions, never removes one (that is `gateway
            # delete`, or `gateway sync` of a folder): nothing found is a wrong path or
            # folder, not a request, and must not pass for a run that wrote a generation.
            fail(
                f"no documents found in {', '.join(str(p) for p in paths)} (files ending "
                f"{' '.join(sorted(SUFFIXES))}); nothing was ingested"
            )
        layout = layout_of(settings)
        embedder = Embedder(precision=settings.embedding_precision)
        _say_numerics(embedder)
        report = ingest_documents(
            documents,
            layout,
            embedder,
            policy.chunking,
            progress=True,
            ann_min_rows=policy.retrieval.ann_min_rows,
        )
    except DocumentsRefused as exc:
        fail(f"refused, nothing was ingested:\n{exc}")
    except GatewayError as exc:
        fail(f"{exc.code}: {exc.detail}")
    typer.echo(
        f"generation {report.generation}: {report.documents} documents, {report.chunks} chunks, "
        f"{report.revised} versions closed, {report.unchanged} unchanged, {report.seconds:.1f} s "
        f"({report.chunks_per_s:.0f} chunks/s embedding)"
    )


def _say_numerics(embedder: Embedder) -> None:
    """What the writer logs at start (docs/operations.md, "Embedding precision"), on
    standard error beside the progress lines; as a warning when bfloat16 is emulated."""
    from gateway.embedding.precision import choice_line

    numerics = embedder.numerics
    typer.echo(("warning: " if numerics.emulated else "") + choice_line(numerics), err=True)


TenantOption = Annotated[
    str | None,
    typer.Option(
        help="The document's tenant: a document is (tenant, doc_id). Needed only when "
        "several tenants have a document of this ID."
    ),
]


def _tenant_of(layout: DataLayout, doc_id: str, tenant: str | None) -> str:
    """The tenant named, or the only tenant that has `doc_id`; never several at once."""
    if tenant is not None:
        return tenant
    found = layout.open_catalog().tenants_of(doc_id)
    if len(found) > 1:
        fail(f"{doc_id} exists in tenants {', '.join(found)}: name one with --tenant")
    if not found:
        fail(f"not_found: no document {doc_id}")
    return found[0]


def _change_document(
    data_dir: Path | None,
    doc_id: str,
    tenant: str | None,
    change: Callable[[DataLayout, str], GenerationReport | None],
) -> GenerationReport | None:
    """Run a change of one tenant's document, ending the command on an expected error."""

    layout = layout_of(settings_from_env(data_dir))
    try:
        return change(layout, _tenant_of(layout, doc_id, tenant))
    except GatewayError as exc:
        fail(f"{exc.code}: {exc.detail}")


def _say(report: GenerationReport | None, what: str) -> None:
    if report is None:
        typer.echo(f"{what}: nothing to change")
    else:
        typer.echo(f"generation {report.generation}: {what} ({report.seconds:.1f} s)")


def delete(
    doc_id: Annotated[str, typer.Argument(help="The document to remove.")],
    version: Annotated[str | None, typer.Option(help="Only this version.")] = None,
    tenant: TenantOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Remove a document (every version, or one); a version it had closed is reopened."""
    from gateway.ingest.pipeline import delete_versions

    def remove(layout: DataLayout, owner: str) -> GenerationReport | None:
        return delete_versions(layout, owner, doc_id, version)

    report = _change_document(data_dir, doc_id, tenant, remove)
    _say(report, f"deleted {report.deleted if report else 0} version(s) of {doc_id}")


def acl_set(
    doc_id: Annotated[str, typer.Argument(help="The document whose ACL is replaced.")],
    acl: Annotated[list[str], typer.Option(help="A principal that may read it; repeat.")],
    version: Annotated[str | None, typer.Option(help="Only this version.")] = None,
    tenant: TenantOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Replace a document's ACL without re-embedding; effective for the next request."""
    from gateway.ingest.pipeline import set_acl

    def replace_acl(layout: DataLayout, owner: str) -> GenerationReport | None:
        return set_acl(layout, owner, doc_id, acl, version)

    report = _change_document(data_dir, doc_id, tenant, replace_acl)
    _say(report, f"ACL of {doc_id} set to {', '.join(acl)}")


def reindex(data_dir: DataDirOption = None) -> None:
    """Embed every document again with the configured model, into a fresh index."""
    from gateway.embedding import Embedder
    from gateway.ingest.pipeline import reindex as reindex_all
    from gateway.policy.loader import load_policy

    settings = settings_from_env(data_dir)
    layout = layout_of(settings)
    try:
        policy = load_policy(settings.policy_dir).policy
        embedder = Embedder(precision=settings.embedding_precision)
        _say_numerics(embedder)
        report = reindex_all(
            layout,
            embedder,
            policy.chunking,
            progress=True,
            ann_min_rows=policy.retrieval.ann_min_rows,
        )
    except GatewayError as exc:
        fail(f"{exc.code}: {exc.detail}")
    _say(report, f"re-embedded {report.documents} versions, {report.chunks} chunks")
