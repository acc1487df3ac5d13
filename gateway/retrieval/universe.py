"""The caller's searchable universe: one Restriction, its reference predicate, its SQL form.

`visible()` is the single source of truth for visibility. Each engine compiles the same
Restriction into its own filter (the LanceDB `where` clause below, the Tantivy query in
`gateway.storage.lexical`); tests check both against `visible()` on generated data.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from gateway.domain import Caller, Visibility

EPOCH = dt.date(1970, 1, 1)
# Open-ended effective_to is stored as this day number in both engines, so that the range
# check "as_of <= effective_to" needs no special case for NULL.
OPEN_END_DAY = 2_932_896  # 9999-12-31


def day_number(day: dt.date | None) -> int:
    """Days since 1970-01-01; None (open end) maps to OPEN_END_DAY."""
    return OPEN_END_DAY if day is None else (day - EPOCH).days


@dataclass(frozen=True)
class Restriction:
    """Who is asking and as of when; the only input of every engine filter."""

    tenant: str
    principals: frozenset[str]
    regions: frozenset[str]
    as_of: dt.date

    @classmethod
    def for_caller(cls, caller: Caller, as_of: dt.date) -> Restriction:
        return cls(caller.tenant, caller.principals, caller.readable_regions, as_of)

    @property
    def is_empty(self) -> bool:
        """True when nothing can be visible: an empty set is never 'no filter'."""
        return not self.principals or not self.regions or not self.tenant


def visible(restriction: Restriction, meta: Visibility) -> bool:
    """Reference predicate: may the restricted caller see a chunk with this metadata today?"""
    if restriction.is_empty:
        return False
    if meta.tenant != restriction.tenant or meta.region not in restriction.regions:
        return False
    if restriction.principals.isdisjoint(meta.acl):
        return False
    if meta.effective_from > restriction.as_of:
        return False
    return meta.effective_to is None or restriction.as_of <= meta.effective_to


def sql_string(value: str) -> str:
    """A SQL string literal: quotes doubled, NUL refused (never valid in our identifiers)."""
    if "\x00" in value:
        raise ValueError("NUL character in filter value")
    return "'" + value.replace("'", "''") + "'"


def _sql_list(values: frozenset[str]) -> str:
    return "[" + ", ".join(sql_string(v) for v in sorted(values)) + "]"


def to_sql_where(restriction: Restriction) -> str:
    """The LanceDB (DataFusion SQL) prefilter for a restriction; 'false' when empty."""
    if restriction.is_empty:
        return "false"
    as_of = day_number(restriction.as_of)
    return (
        f"tenant = {sql_string(restriction.tenant)}"
        f" AND region IN ({', '.join(sql_string(r) for r in sorted(restriction.regions))})"
        f" AND array_has_any(acl, {_sql_list(restriction.principals)})"
        f" AND effective_from <= {as_of} AND effective_to >= {as_of}"
    )
