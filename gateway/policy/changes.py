"""The answer of a policy diff: changes per kind of caller, what the diff covered (in all
and per tenant), and the table `gateway policy diff` prints. Computed in diff.py."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Change:
    """Callers of one tenant that gain and lose the same document versions."""

    tenant: str
    regions: tuple[str, ...]  # the caller's region: any of these
    groups: tuple[str, ...]  # a token naming any one of these groups (and nothing else named)
    users: tuple[str, ...]  # or one of these subjects (with no named group)
    gains: tuple[str, ...]  # `doc_id@version`
    losses: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "regions": list(self.regions),
            "groups": list(self.groups),
            "users": list(self.users),
            "gains": list(self.gains),
            "losses": list(self.losses),
        }


@dataclass(frozen=True)
class Coverage:
    """What the diff decided over, so its reader knows what "every caller" means."""

    tenants: tuple[str, ...]
    documents: int  # versions in force as of the date, in those tenants
    regions: tuple[str, ...]
    groups: int
    users: int
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PolicyDiff:
    base_version: str
    new_version: str
    as_of: dt.date
    coverage: Coverage
    changes: tuple[Change, ...] = field(default=())
    by_tenant: Mapping[str, Coverage] = field(default_factory=dict)

    def coverage_of(self, tenant: str) -> Coverage:
        """What the diff decided over that concerns `tenant` only: its versions, and the
        regions and groups of callers who read one of them under either policy (not the
        shared policy's other regions or groups, which are other tenants' business)."""
        empty = Coverage((), 0, (), 0, 0, self.coverage.notes)
        return self.by_tenant.get(tenant, empty)

    def widens_for(self, tenant: str) -> bool:
        """Whether any caller of `tenant` gains a document."""
        return any(change.gains for change in self.changes if change.tenant == tenant)

    @property
    def widens(self) -> bool:
        """Whether any caller at all gains a document."""
        return any(change.gains for change in self.changes)

    def totals(self, tenant: str) -> tuple[int, int]:
        """Distinct versions some caller of `tenant` gains, and loses."""
        mine = [c for c in self.changes if c.tenant == tenant]
        return (
            len({d for c in mine for d in c.gains}),
            len({d for c in mine for d in c.losses}),
        )

    def as_json(self) -> dict[str, Any]:
        covered = self.coverage
        return {
            "base_version": self.base_version,
            "new_version": self.new_version,
            "as_of": self.as_of.isoformat(),
            "widens": self.widens,
            "covers": {
                "tenants": list(covered.tenants),
                "documents": covered.documents,
                "regions": list(covered.regions),
                "groups": covered.groups,
                "users": covered.users,
                "notes": list(covered.notes),
            },
            "tenants": [
                {"tenant": t, "gained": g, "lost": lost}
                for t in covered.tenants
                for g, lost in [self.totals(t)]
            ],
            "changes": [c.as_json() for c in self.changes],
        }


def render_table(diff: PolicyDiff, limit: int = 8) -> str:
    """The human view: per tenant, each kind of caller and the versions it gains or loses."""

    def some(names: tuple[str, ...], prefix: str = "") -> str:
        shown = ", ".join(prefix + n for n in names[:limit])
        return shown + (f", … ({len(names)} in all)" if len(names) > limit else "")

    covered = diff.coverage
    lines = [
        f"policy {diff.base_version} -> {diff.new_version}, as of {diff.as_of.isoformat()}",
        f"covers {len(covered.tenants)} tenant(s), {covered.documents} version(s) in force, "
        f"{len(covered.regions)} region(s), {covered.groups} group(s), {covered.users} user(s)",
    ]
    lines += [f"  note: {note}" for note in covered.notes]
    for tenant in covered.tenants:
        gained, lost = diff.totals(tenant)
        lines.append("")
        lines.append(f"tenant {tenant}: {gained} version(s) gained, {lost} lost by some caller")
        for change in (c for c in diff.changes if c.tenant == tenant):
            who = " or ".join(
                part
                for part in (some(change.groups, "group:"), some(change.users, "user:"))
                if part
            )
            lines.append(f"  callers in {some(change.regions)} holding {who}")
            if change.gains:
                lines.append(f"    gain {len(change.gains)}: {some(change.gains)}")
            if change.losses:
                lines.append(f"    lose {len(change.losses)}: {some(change.losses)}")
    lines.append("")
    lines.append("widens: yes, some caller gains a document" if diff.widens else "widens: no")
    return "\n".join(lines)
