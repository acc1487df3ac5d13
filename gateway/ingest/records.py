"""Documents sent as JSON records (the push API's batches, and the jobs that keep them).

A record is checked by the same rules as a file's metadata (`parse_record`), with the
tenant always the sender's. A batch is refused as a whole, every problem listed with the
document's index in the batch, its `doc_id` and the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.domain import Document
from gateway.ingest.parse import DocumentsRefused, parse_record


@dataclass(frozen=True)
class BatchProblem:
    index: int | None  # the document's place in the batch; None: the batch as a whole
    doc_id: str | None
    field: str | None
    message: str  # names fields and identifiers, never the text


def document_of(record: Mapping[str, Any], tenant: str, source: str) -> Document:
    """The Document of one record in `tenant` (DocumentsRefused when it is invalid)."""
    text = record.get("text")
    return parse_record(
        {**record, "tenant": tenant}, text if isinstance(text, str) else None, source, ""
    )


def record_of(doc: Document) -> dict[str, Any]:
    """A valid Document as the record a job keeps (its tenant is the job's)."""
    v = doc.visibility
    return {
        "doc_id": doc.doc_id,
        "version": doc.version,
        "title": doc.title,
        "uri": doc.uri,
        "text": doc.text,
        "region": v.region,
        "acl": list(v.acl),
        "effective_from": v.effective_from.isoformat(),
        "effective_to": v.effective_to.isoformat() if v.effective_to else None,
    }


def documents_of_records(
    items: Sequence[Any], tenant: str
) -> tuple[list[Document], list[BatchProblem]]:
    """Every item as a Document of `tenant`, and every problem found in any of them,
    including a version sent twice in one batch."""
    documents: list[Document] = []
    problems: list[BatchProblem] = []
    first: dict[tuple[str, str], int] = {}
    for index, item in enumerate(items):
        doc_id = named(item)
        if not isinstance(item, Mapping):
            problems.append(BatchProblem(index, None, None, "must be a JSON object"))
            continue
        try:
            doc = document_of(item, tenant, f"documents[{index}]")
        except DocumentsRefused as refused:
            problems += [BatchProblem(index, doc_id, p.field, p.message) for p in refused.problems]
            continue
        seen = first.setdefault((doc.doc_id, doc.version), index)
        if seen != index:
            message = f"{doc.label} is also document {seen} of this batch"
            problems.append(BatchProblem(index, doc_id, "version", message))
        documents.append(doc)
    return documents, problems


def named(item: object) -> str | None:
    """The doc_id an item names, when it names one a reader can be shown."""
    doc_id = item.get("doc_id") if isinstance(item, Mapping) else None
    showable = isinstance(doc_id, str) and doc_id.isprintable() and len(doc_id) <= 512
    return doc_id if showable else None
