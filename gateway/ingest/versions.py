"""Supersession: which open-ended versions a batch closes, and at which day.

For each document, a tenant's `doc_id` (another tenant's document of the same ID is another
document), versions are ordered by effective_from, then by version (`version_order`: "10"
after "9"); an open-ended version followed by another is closed the day before that one
starts. Of two versions starting the same day the higher one is in force: a correction
issued the same day supersedes the version it corrects, which is then never in force
(closed the day before it starts), whichever was ingested first. Explicit end dates are
never moved. This is a pure function so its rules can be tested as a table.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gateway.domain import Document, version_key, version_label, version_order

ONE_DAY = dt.timedelta(days=1)


@dataclass(frozen=True)
class VersionSpan:
    tenant: str
    doc_id: str
    version: str
    effective_from: dt.date
    effective_to: dt.date | None

    @property
    def key(self) -> str:
        return version_key(self.tenant, self.doc_id, self.version)


@dataclass(frozen=True)
class Closure:
    effective_to: dt.date
    closed_by: str  # `doc_id@version` of the version (same tenant) that superseded it


def plan_closures(existing: Sequence[VersionSpan], batch: Sequence[Document]) -> dict[str, Closure]:
    """Closures for every version (existing or in the batch) that a later version supersedes."""
    replaced = {d.key for d in batch}
    by_doc: dict[tuple[str, str], list[VersionSpan]] = defaultdict(list)
    for span in existing:
        if span.key not in replaced:
            by_doc[(span.tenant, span.doc_id)].append(span)
    for d in batch:
        v = d.visibility
        span = VersionSpan(v.tenant, d.doc_id, d.version, v.effective_from, v.effective_to)
        by_doc[(v.tenant, d.doc_id)].append(span)

    closures: dict[str, Closure] = {}
    for spans in by_doc.values():
        spans.sort(key=lambda s: (s.effective_from, version_order(s.version)))
        for span, successor in itertools.pairwise(spans):
            if span.effective_to is None:
                label = version_label(successor.doc_id, successor.version)
                closures[span.key] = Closure(successor.effective_from - ONE_DAY, label)
    return closures


def apply_closures(batch: Sequence[Document], closures: dict[str, Closure]) -> list[Document]:
    """The batch with its own superseded versions closed."""
    out = []
    for doc in batch:
        closure = closures.get(doc.key)
        if closure is None:
            out.append(doc)
        else:
            visibility = replace(doc.visibility, effective_to=closure.effective_to)
            out.append(replace(doc, visibility=visibility))
    return out
