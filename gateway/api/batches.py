"""The body of `POST /admin/documents` to validated documents, or a refusal that lists the
batch's problems at once (index, doc_id, field, message; the first MAX_LISTED, all
counted), so a connector fixes them in one round. Nothing is queued for a refused batch."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from gateway.api.schemas import MAX_BATCH_DOCUMENTS as MAX_DOCUMENTS
from gateway.api.schemas import IngestBatch
from gateway.domain import Document
from gateway.errors import GatewayError
from gateway.ingest.parse import strict_object
from gateway.ingest.records import BatchProblem, documents_of_records, named
from gateway.jsonbody import loads

# Problems listed in a refusal: a client fixes the first ones and sends again; the rest
# are counted. One problem per field of a thousand documents listed made a 50 MB body.
MAX_LISTED = 100


def validated_batch(body: bytes, tenant: str) -> list[Document]:
    """The batch's documents, in `tenant`; 403 `tenant_mismatch` when one names another
    tenant, 422 `validation_error` with every problem otherwise."""
    try:
        parsed = loads(body, object_pairs_hook=strict_object)
    except ValueError as exc:  # never the bytes
        if isinstance(exc, json.JSONDecodeError):
            message = f"not UTF-8 JSON at {exc.pos}"
        elif isinstance(exc, UnicodeDecodeError):
            message = "not UTF-8 JSON"
        else:
            message = str(exc)  # nested too deeply, or strict_object's duplicate key
        raise _refused([BatchProblem(None, None, None, message)]) from None
    items = parsed.get("documents") if isinstance(parsed, dict) else None
    items = items if isinstance(items, list) else []
    if len(items) > MAX_DOCUMENTS:  # before any item is looked at: each could be a problem
        problem = f"{len(items)} documents; a batch holds at most {MAX_DOCUMENTS}"
        raise _refused([BatchProblem(None, None, "documents", problem)])
    elsewhere = [
        i for i, item in enumerate(items) if isinstance(item, dict) and _other_tenant(item, tenant)
    ]
    if elsewhere:
        raise GatewayError(
            "tenant_mismatch",
            f"documents {elsewhere[:20]} name a tenant other than yours; a caller writes to its "
            "own tenant only. Nothing was queued.",
        )
    problems = _schema_problems(parsed, items)
    documents, found = documents_of_records(items, tenant)
    seen = {(p.index, p.field) for p in problems}
    problems += [p for p in found if (p.index, p.field) not in seen]
    if problems:
        raise _refused(problems)
    return documents


def _other_tenant(item: dict[str, Any], tenant: str) -> bool:
    return "tenant" in item and item["tenant"] is not None and item["tenant"] != tenant


def _schema_problems(parsed: object, items: list[Any]) -> list[BatchProblem]:
    """What the published schema refuses: shape, types, lengths, unknown fields."""
    try:
        IngestBatch.model_validate(parsed)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = error["loc"]
            if len(loc) >= 2 and loc[0] == "documents" and isinstance(loc[1], int):
                index = loc[1]
                field = str(loc[2]) if len(loc) > 2 else None
                doc_id = named(items[index]) if index < len(items) else None
            else:
                index, doc_id, field = None, None, ".".join(str(p) for p in loc) or None
            message = "unknown field" if error["type"] == "extra_forbidden" else error["msg"]
            problems.append(BatchProblem(index, doc_id, field, message))
        return problems
    return []


def _refused(problems: list[BatchProblem]) -> GatewayError:
    """422 listing the first MAX_LISTED problems (the detail counts them all)."""
    documents = len({p.index for p in problems if p.index is not None})
    errors = [
        {"index": p.index, "doc_id": p.doc_id, "field": p.field, "message": p.message}
        for p in problems[:MAX_LISTED]
    ]
    listed = "" if len(problems) <= MAX_LISTED else f" (the first {MAX_LISTED} listed)"
    return GatewayError(
        "validation_error",
        f"{len(problems)} problems in {documents} documents{listed}; nothing was queued",
        extra={"errors": errors},
    )
