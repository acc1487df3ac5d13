"""The caller's searchable universe: one Restriction and its reference predicate.

`visible()` is the single source of truth for visibility. Each engine compiles the same
Restriction into its own filter (the LanceDB `where` clause in `gateway.storage.vectors`,
the Tantivy query in `gateway.storage.lexical`); tests check both against `visible()` on
generated data. It sits below storage and retrieval alike, so that storage, which compiles
it, never imports retrieval, which uses it.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

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
    # The asking caller's `Caller.cache_scope`, for the query-vector cache; no filter reads
    # it, and it takes no part in equality.
    asker: str = field(default="", compare=False)

    @classmethod
    def for_caller(cls, caller: Caller, as_of: dt.date) -> Restriction:
        return cls(
            caller.tenant, caller.principals, caller.readable_regions, as_of, caller.cache_scope
        )

    def narrowed_to(self, principals_in_use: frozenset[str]) -> Restriction:
        """The same universe with only the principals some ACL in the index names.

        A principal no document lists can never make anything visible, so dropping it
        changes no decision; it keeps the engines' filters small when nested groups give a
        caller thousands of principals. None in use leaves an empty restriction: nothing."""
        return Restriction(
            self.tenant, self.principals & principals_in_use, self.regions, self.as_of, self.asker
        )

    @property
    def is_empty(self) -> bool:
        """True when nothing can be visible: an empty set is never 'no filter'."""
        return not self.principals or not self.regions or not self.tenant


@dataclass(frozen=True)
class Decision:
    """Whether a caller sees a document version, and the rule that decided it."""

    visible: bool
    # The first rule that failed, in the order checked: "no_principals", "tenant", "region",
    # "acl", "effective_from", "effective_to"; or "acl" when everything passed.
    rule: str
    matched: tuple[str, ...] = ()  # the caller's principals that the ACL names


def decide(restriction: Restriction, meta: Visibility) -> Decision:
    """The reference decision: deny at the first rule that fails, allow only if none does."""
    if restriction.is_empty:
        return Decision(False, "no_principals")
    if meta.tenant != restriction.tenant:
        return Decision(False, "tenant")
    if meta.region not in restriction.regions:
        return Decision(False, "region")
    matched = tuple(sorted(restriction.principals.intersection(meta.acl)))
    if not matched:
        return Decision(False, "acl")
    if meta.effective_from > restriction.as_of:
        return Decision(False, "effective_from", matched)
    if meta.effective_to is not None and restriction.as_of > meta.effective_to:
        return Decision(False, "effective_to", matched)
    return Decision(True, "acl", matched)


def visible(restriction: Restriction, meta: Visibility) -> bool:
    """Reference predicate: may the restricted caller see a chunk with this metadata today?"""
    return decide(restriction, meta).visible
