"""Why a caller would, or would not, see a document: each version's decision by rule name.

The same `decide()` that defines visibility for search answers here, so an explanation
cannot disagree with what the caller actually gets. Only IDs, dates, principals and rule
names are reported, never a title or a line of the document.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from gateway.domain import Caller, version_order
from gateway.restriction import Decision, Restriction, decide
from gateway.storage.catalog import Catalog, DocumentRow


@dataclass(frozen=True)
class VersionDecision:
    version: str
    effective_from: dt.date
    effective_to: dt.date | None
    decision: Decision
    granted_by: dict[str, str]  # matched principal -> the policy rule that gave it


@dataclass(frozen=True)
class Explanation:
    doc_id: str
    as_of: dt.date
    deciding: VersionDecision  # the visible version, else the one in force, else the newest
    versions: list[VersionDecision]

    @property
    def visible(self) -> bool:
        return self.deciding.decision.visible


def document_versions(catalog: Catalog, doc_id: str, tenant: str) -> list[DocumentRow]:
    """Versions of `doc_id` in `tenant`, oldest first (of those starting the same day, the
    lowest: `version_order`, as `GET /documents` picks); other tenants' are not there."""
    rows = catalog.versions_of([(tenant, doc_id)])
    return sorted(rows, key=lambda r: (r.effective_from, version_order(r.version)))


def explain(rows: list[DocumentRow], caller: Caller, as_of: dt.date) -> Explanation:
    restriction = Restriction.for_caller(caller, as_of)
    versions = []
    for row in rows:
        decision = decide(restriction, row.visibility)
        granted_by = {p: caller.source_of(p) or "unknown" for p in decision.matched}
        versions.append(
            VersionDecision(row.version, row.effective_from, row.effective_to, decision, granted_by)
        )
    in_force = [
        v
        for v in versions
        if v.effective_from <= as_of and (v.effective_to is None or as_of <= v.effective_to)
    ]
    visible = [v for v in versions if v.decision.visible]
    deciding = (visible or in_force or versions)[-1]
    return Explanation(rows[0].doc_id, as_of, deciding, versions)
