"""The changes a data dir accepts, each planned as one `ChangeSet` and written atomically.

- ingest: new or replaced versions; a version starting on day D closes the open-ended
  version before it at D - 1 (supersession, recorded as `closed_by`). Closures are planned
  again from every version's start, so one added in between, or moved, moves them too.
- delete: versions removed; a version that a deleted one had closed is reopened (or closed
  by the next remaining version), as if the deleted one had never been ingested.
- ACL change: new ACLs for existing versions, re-indexed without re-embedding.
- reindex: every version embedded again into a fresh index, e.g. with another model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.domain import Document, version_label
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.ingest.chunk import DEFAULT_CHUNKING, ChunkingOptions
from gateway.ingest.encoding import Encoded
from gateway.ingest.parse import checked_acl
from gateway.ingest.sources import load_documents
from gateway.ingest.versions import VersionSpan, apply_closures, plan_closures
from gateway.ingest.writer import ChangeSet, GenerationReport, Plan, content_hash, write_generation
from gateway.policy.model import Retrieval
from gateway.storage.catalog import Catalog, DocumentRow, Revision
from gateway.storage.erasures import request_on
from gateway.storage.jobs import patch_pending
from gateway.storage.layout import DataLayout

if TYPE_CHECKING:
    from sqlalchemy import Connection

DEFAULT_ANN_MIN_ROWS = Retrieval().ann_min_rows  # the policy's default

__all__ = ["GenerationReport", "content_hash", "ingest_documents", "ingest_paths"]


def ingest_paths(
    paths: Sequence[Path],
    layout: DataLayout,
    embedder: Embedder,
    options: ChunkingOptions = DEFAULT_CHUNKING,
    progress: bool = False,
    ann_min_rows: int = DEFAULT_ANN_MIN_ROWS,
) -> GenerationReport:
    """Parse and validate every path (all-or-nothing), then write one generation."""
    documents = load_documents(paths)
    return ingest_documents(documents, layout, embedder, options, progress, ann_min_rows)


def ingest_documents(
    documents: Sequence[Document],
    layout: DataLayout,
    embedder: Embedder,
    options: ChunkingOptions = DEFAULT_CHUNKING,
    progress: bool = False,
    ann_min_rows: int | None = DEFAULT_ANN_MIN_ROWS,
    encoded: Encoded | None = None,
) -> GenerationReport:
    """New versions (closing the open-ended versions they supersede) as one generation;
    chunked and embedded here unless `encoded` brings their chunks and vectors. A version
    sent again unchanged (same text by content hash, title, uri and visibility) is left as
    it is: a batch of only such versions writes no generation at all, unless an end date
    of their documents' versions is planned otherwise than stored."""
    started = time.perf_counter()
    written = write_generation(
        layout,
        lambda catalog: plan_ingest(catalog, documents),
        embedder=embedder,
        options=options,
        progress=progress,
        ann_min_rows=ann_min_rows,
        encoded=encoded,
    )
    if written.report is None:  # every version was already there, as sent
        no_generation = _no_generation(layout, written.plan)
        return replace(no_generation, seconds=time.perf_counter() - started)
    return written.report


def plan_ingest(catalog: Catalog, documents: Sequence[Document]) -> Plan:
    """New versions, with the end dates of the document's versions planned again (see
    `_replan`), even where every version is sent unchanged; a version the catalog holds
    exactly as sent is left as it is (`Plan.unchanged`)."""
    existing = catalog.versions_of((d.visibility.tenant, d.doc_id) for d in documents)
    stored = {r.key: r for r in existing}
    unchanged = tuple(d.key for d in documents if _same(d, stored.get(d.key)))
    changed = [d for d in documents if d.key not in set(unchanged)]
    # Planned again even when every version is unchanged: a version sent again is how end
    # dates an earlier release closed wrongly are corrected (CHANGELOG, migration notes);
    # where they are right, nothing is revised and no generation is written.
    replaced = {d.key for d in changed}
    batch, revise = _replan([r for r in existing if r.key not in replaced], changed)
    return Plan(ChangeSet(add=batch, revise=revise), unchanged=unchanged)


def unchanged_of(catalog: Catalog, documents: Sequence[Document]) -> set[str]:
    """Keys of the versions the catalog holds exactly as sent (no lock: a hint for what to
    embed ahead; the write decides again under the lock)."""
    stored = {
        r.key: r for r in catalog.versions_of((d.visibility.tenant, d.doc_id) for d in documents)
    }
    return {d.key for d in documents if _same(d, stored.get(d.key))}


def _same(doc: Document, row: DocumentRow | None) -> bool:
    """Whether `row` already holds `doc` exactly; an end date that supersession set counts
    as the open end the document was sent with."""
    if row is None or row.content_hash != content_hash(doc):
        return False
    if (row.title, row.uri) != (doc.title, doc.uri):
        return False
    stored, sent = row.visibility, doc.visibility
    if row.closed_by and sent.effective_to is None:
        stored = replace(stored, effective_to=None)
    return stored == sent


def delete_versions(
    layout: DataLayout,
    tenant: str,
    doc_id: str,
    version: str | None = None,
    *,
    only_by: str | None = None,
) -> GenerationReport:
    """Remove one version, or every version, of a tenant's document, from the index and
    from ingest jobs still queued or running; GatewayError if it is in neither. Other
    tenants' documents of the same ID are other documents, never touched. With `only_by`
    (an ingest key's subject), 403 `not_owner` unless that subject pushed every version."""

    def plan(catalog: Catalog) -> Plan:
        if only_by is not None:  # under the writer's lock: no push lands in between
            catalog.owners.require(tenant, [doc_id], only_by)
        queued = _pending(catalog, tenant, doc_id, version, None)
        rows = catalog.versions_of([(tenant, doc_id)])
        doomed = {r.key for r in rows if version is None or r.version == version}
        if not doomed and not queued:
            what = version_label(doc_id, version) if version is not None else doc_id
            raise GatewayError("not_found", f"no document {what} in tenant {tenant}")
        remaining = [r for r in rows if r.key not in doomed]
        _, revise = _replan(remaining)
        changes = ChangeSet(delete=frozenset(doomed), revise=revise)
        return _with_pending(catalog, Plan(changes, queued=queued), patch)

    def patch(connection: Connection) -> None:
        patch_pending(connection, tenant, doc_id, version, None)

    def within(connection: Connection, _: int, __: Mapping[str, int]) -> None:
        # The queued copies go, and the erasure is requested, in the delete's own
        # transaction: with it, or not at all.
        patch(connection)
        request_on(connection, tenant, "delete")

    written = write_generation(layout, plan, within=within)
    if written.report is None and written.plan.queued:  # only queued jobs' records changed
        layout.open_catalog().erasures.request(tenant, "delete")
    return written.report or _no_generation(layout, written.plan)


def set_acl(
    layout: DataLayout,
    tenant: str,
    doc_id: str,
    acl: Sequence[str],
    version: str | None = None,
    *,
    only_by: str | None = None,
) -> GenerationReport | None:
    """New ACL for one or every version of a tenant's document, in the index and in ingest
    jobs still queued or running; None when nothing changes. Refuses a bad ACL, and with
    `only_by` (an ingest key's subject) a document it did not push (403 `not_owner`)."""
    # Ingest's own checks, so that no principal is stored here that a push would refuse
    # (one with a trailing space matches no caller's claim).
    checked, problems = checked_acl(acl)
    if problems:
        raise GatewayError("invalid_document", "acl: " + "; ".join(problems))
    principals = tuple(dict.fromkeys(checked))

    def plan(catalog: Catalog) -> Plan:
        if only_by is not None:
            catalog.owners.require(tenant, [doc_id], only_by)
        # Queued copies too, so that a batch sent before this change never brings the old
        # ACL back; they are patched in the commit (`patch`).
        queued = _pending(catalog, tenant, doc_id, version, principals)
        rows = [r for r in catalog.versions_of([(tenant, doc_id)]) if version in (None, r.version)]
        if not rows and not queued:
            what = version_label(doc_id, version) if version is not None else doc_id
            raise GatewayError("not_found", f"no document {what} in tenant {tenant}")
        revise = {
            r.key: Revision(replace(r.visibility, acl=principals), r.closed_by)
            for r in rows
            if r.visibility.acl != principals
        }
        return _with_pending(catalog, Plan(ChangeSet(revise=revise), queued=queued), patch)

    def patch(connection: Connection) -> None:
        patch_pending(connection, tenant, doc_id, version, principals)

    written = write_generation(layout, plan, within=lambda connection, _, __: patch(connection))
    if written.report is None and written.plan.queued:
        return _no_generation(layout, written.plan)
    return written.report


def _pending(
    catalog: Catalog, tenant: str, doc_id: str, version: str | None, acl: Sequence[str] | None
) -> int:
    """How many records of queued and running jobs the change applies to (none changed)."""
    with catalog.engine.connect() as connection:
        return patch_pending(connection, tenant, doc_id, version, acl, count_only=True)


def _with_pending(catalog: Catalog, plan: Plan, patch: Callable[[Connection], None]) -> Plan:
    """`plan`, whose queued copies (`plan.queued`) are patched in the transaction that
    commits its generation; when it needs none, at once, still under the writer lock (no
    write follows that could fail, and no writer reads the jobs' records in between)."""
    if plan.changes.empty and plan.queued:
        with catalog.engine.begin() as connection:
            patch(connection)
    return plan


def _no_generation(layout: DataLayout, plan: Plan) -> GenerationReport:
    """The report of a change that needed no new generation: the current one holds it."""
    current = layout.open_catalog().current_generation_id() or 0
    return GenerationReport(
        current, 0, 0, 0, 0, 0.0, 0.0, unchanged=len(plan.unchanged), queued=plan.queued
    )


def reindex(
    layout: DataLayout,
    embedder: Embedder,
    options: ChunkingOptions = DEFAULT_CHUNKING,
    progress: bool = False,
    ann_min_rows: int = DEFAULT_ANN_MIN_ROWS,
) -> GenerationReport:
    """Every version chunked and embedded again, by the configured model and chunking,
    into a fresh index."""

    def plan(catalog: Catalog) -> Plan:
        rows = catalog.all_documents()
        if not rows:
            raise GatewayError("not_found", "nothing to reindex: the catalog has no documents")
        documents = [_document(r) for r in rows]
        closed = {r.key: Revision(r.visibility, r.closed_by) for r in rows if r.closed_by}
        return Plan(ChangeSet(add=documents, revise=closed, rebuild=True))

    report = write_generation(
        layout,
        plan,
        embedder=embedder,
        options=options,
        progress=progress,
        ann_min_rows=ann_min_rows,
    ).report
    assert report is not None
    return report


def _replan(
    remaining: Iterable[DocumentRow], batch: Sequence[Document] = ()
) -> tuple[list[Document], dict[str, Revision]]:
    """End dates of the stored versions left (after a delete, or beside an ingest's batch)
    and of the batch: automatic closures are planned again from scratch, so that a version
    added between two others, deleted, or sent again with another start moves them (earlier,
    later, or away); explicit end dates never move. The batch with its closures applied,
    and a revision for each version whose end date or closer changes."""
    rows = list(remaining)
    spans = [
        VersionSpan(
            r.tenant, r.doc_id, r.version, r.effective_from, None if r.closed_by else r.effective_to
        )
        for r in rows
    ]
    closures = plan_closures(spans, batch)
    revise = {}
    for row, span in zip(rows, spans, strict=True):
        closure = closures.get(row.key)
        end = closure.effective_to if closure else span.effective_to
        closed_by = closure.closed_by if closure else None
        if (end, closed_by) != (row.effective_to, row.closed_by):
            revise[row.key] = Revision(replace(row.visibility, effective_to=end), closed_by)
    closed_batch = apply_closures(batch, closures)
    for doc in closed_batch:
        if doc.key in closures:  # recorded with its closer once the batch's rows are in
            revise[doc.key] = Revision(doc.visibility, closures[doc.key].closed_by)
    return closed_batch, revise


def _document(row: DocumentRow) -> Document:
    return Document(
        row.doc_id, row.version, row.title, row.uri, row.text, row.visibility, row.source
    )
