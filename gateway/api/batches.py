"""The body of `POST /admin/documents` to validated documents, or a refusal that lists every
problem of the batch at once (index, doc_id, field, message), so a connector fixes them all
in one round. Nothing is queued for a refused batch."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from gateway.api.schemas import IngestBatch
from gateway.domain import Document
from gateway.errors import GatewayError
from gateway.ingest.records import BatchProblem, documents_of_records, named


def validated_batch(body: bytes, tenant: str) -> list[Document]:
    """The batch's documents, in `tenant`; 403 `tenant_mismatch` when one names another
    tenant, 422 `validation_error` with every problem otherwise."""
    try:
        parsed = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:  # the position only, never the bytes
        where = f" at {exc.pos}" if isinstance(exc, json.JSONDecodeError) else ""
        raise _refused([BatchProblem(None, None, None, f"not UTF-8 JSON{where}")]) from None
    items = parsed.get("documents") if isinstance(parsed, dict) else None
    items = items if isinstance(items, list) else []
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
    documents = len({p.index for p in problems if p.index is not None})
    errors = [
        {"index": p.index, "doc_id": p.doc_id, "field": p.field, "message": p.message}
        for p in problems
    ]
    return GatewayError(
        "validation_error",
        f"{len(problems)} problems in {documents} documents; nothing was queued",
        extra={"errors": errors},
    )
