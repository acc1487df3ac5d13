"""Direct reads by ID, under the same reference predicate as search.

Whatever the caller may not see today is answered exactly like something that does not
exist (None -> 404), so a probe by ID learns nothing: not from the answer, and not from
its time. Visibility is decided from the visibility columns of the caller's own tenant
alone; a row's text is read only once it is known to be visible.
"""

from __future__ import annotations

import datetime as dt

from gateway.domain import Caller, split_chunk_id, version_order
from gateway.restriction import Restriction, visible
from gateway.storage.catalog import Catalog, ChunkRow, DocumentRow


def visible_document(
    catalog: Catalog, caller: Caller, doc_id: str, as_of: dt.date
) -> DocumentRow | None:
    """The version of `doc_id` the caller may see today (the latest to start, if several;
    of those starting the same day, the highest: `version_order`)."""
    restriction = Restriction.for_caller(caller, as_of)
    if restriction.is_empty:
        return None
    versions = [
        (meta.effective_from, version_order(version), version)
        for version, meta in catalog.visibility_of(caller.tenant, doc_id)
        if visible(restriction, meta)
    ]
    if not versions:
        return None
    return catalog.document(caller.tenant, doc_id, max(versions)[2])


def visible_chunk(
    catalog: Catalog, caller: Caller, chunk_id: str, as_of: dt.date
) -> tuple[ChunkRow, DocumentRow] | None:
    try:
        doc_id, version, _ordinal = split_chunk_id(chunk_id)
    except ValueError:
        return None
    restriction = Restriction.for_caller(caller, as_of)
    if restriction.is_empty:
        return None
    found = catalog.visibility_of(caller.tenant, doc_id, version)
    if not found or not visible(restriction, found[0][1]):
        return None
    chunk = catalog.chunk(caller.tenant, chunk_id)
    document = catalog.document(caller.tenant, doc_id, version)
    return None if chunk is None or document is None else (chunk, document)
