"""Direct reads by ID, under the same reference predicate as search.

Whatever the caller may not see today is answered exactly like something that does not
exist (None -> 404), so a probe by ID learns nothing.
"""

from __future__ import annotations

import datetime as dt

from gateway.domain import Caller, split_chunk_id
from gateway.restriction import Restriction, visible
from gateway.storage.catalog import Catalog, ChunkRow, DocumentRow


def visible_document(
    catalog: Catalog, caller: Caller, doc_id: str, as_of: dt.date
) -> DocumentRow | None:
    """The version of `doc_id` the caller may see today (the latest to start, if several)."""
    restriction = Restriction.for_caller(caller, as_of)
    if restriction.is_empty:
        return None
    rows = [r for r in catalog.versions_of([doc_id]) if visible(restriction, r.visibility)]
    return max(rows, key=lambda r: (r.effective_from, r.version), default=None)


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
    document = catalog.document(doc_id, version)
    if document is None or not visible(restriction, document.visibility):
        return None
    chunk = catalog.chunk(chunk_id)
    return None if chunk is None else (chunk, document)
