"""What a policy change does to who sees what: `gateway policy diff` and the preview route.

A caller's visibility depends on its region and on the principals the policy resolves from
its token: `user:<sub>`, its groups, the groups they are nested in, and their grants. Only
names some policy or ACL mentions can change a decision, and what a caller holding several
groups sees is the union of what each of them gives (`decide()` asks for any principal in
the ACL). So every caller is covered by "atoms": a region (each region named by a document
or either policy, and one standing for every other) with one named group, or one user an
ACL names. An atom gains a document when the new policy shows it and the base does not; a
caller gains a document only if one of its atoms does, so `widens` is exact for every
caller. (A caller holding two groups, one losing a document and one gaining it, sees no
change; its atoms are listed as they are.)

The changes are found with set algebra over the inverse of principal resolution (which
atoms produce a principal), so a large policy costs sets, not a decision per caller and
document; each change found is then decided by `decide()` under both policies, the
predicate the engines' filters are tested against.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.domain import Visibility, version_label
from gateway.errors import GatewayError
from gateway.policy.bounds import Preview, held_over
from gateway.policy.changes import Change, Coverage, PolicyDiff
from gateway.policy.changes import render_table as render_table  # the CLI's and tests' import
from gateway.policy.loader import LoadedPolicy
from gateway.policy.model import Policy
from gateway.policy.resolve import readable_regions, resolve_caller
from gateway.restriction import Restriction, decide

OTHER_REGION = "(any other region)"  # how the stand-in for unnamed regions is shown


class DiffTimeout(Exception):
    """The diff ran past its deadline and stopped (a thread cannot be cancelled, so the
    diff checks the clock itself and the preview's time limit frees its CPU)."""


def _in_time(deadline: float | None) -> None:
    if deadline is not None and time.monotonic() > deadline:
        raise DiffTimeout


@dataclass(frozen=True)
class Atom:
    """The simplest caller of a kind: one group (and a subject no ACL names), or one user
    an ACL names (and no group)."""

    kind: str  # "group" or "user"
    name: str

    def claims(self, policy: Policy, region: str, nobody: str) -> dict[str, Any]:
        names = policy.claims
        subject = self.name if self.kind == "user" else nobody
        groups = [self.name] if self.kind == "group" else []
        return {
            names.subject: subject,
            names.tenant: "t",
            names.region: region,
            names.groups: groups,
        }


def diff_policies(
    base: LoadedPolicy,
    new: LoadedPolicy,
    versions: Iterable[tuple[str, str, Visibility]],
    as_of: dt.date,
    deadline: float | None = None,
    directory_groups: Iterable[str] = (),
    bounds: Preview | None = None,
) -> PolicyDiff:
    """Who gains and loses which versions (`(doc_id, version, visibility)`) as of `as_of`;
    DiffTimeout past `deadline` (`time.monotonic()`), when one is given, and 422
    `preview_too_large` once its callers hold more principals than `bounds.max_held`. The
    groups of the directory (SCIM) are callers too, as a token's groups are."""
    in_force = [
        (version_label(doc_id, version), vis)
        for doc_id, version, vis in versions
        if vis.effective_from <= as_of and (vis.effective_to is None or as_of <= vis.effective_to)
    ]  # a version out of force is seen by nobody under either policy
    policies = (base.policy, new.policy)
    regions = _named_regions(policies, (vis.region for _, vis in in_force))
    other = _unused("other-region", regions)
    region_names = {**{r: r for r in regions}, other: OTHER_REGION}
    groups, users = _named_groups_and_users(policies, (vis.acl for _, vis in in_force))
    from_directory = {g for g in directory_groups if g}
    groups |= from_directory
    nobody = _unused("nobody", users)
    atoms = [Atom("group", g) for g in sorted(groups)] + [Atom("user", u) for u in sorted(users)]
    all_regions = [*sorted(regions), other]

    # Per policy: each atom's principals, who produces each principal, what each region reads.
    principals: list[list[frozenset[str]]] = []
    producers: list[dict[str, set[int]]] = []
    readable: list[dict[str, frozenset[str]]] = []
    held_in_all = 0
    for policy in policies:
        held = []
        for kind in atoms:
            _in_time(deadline)
            held.append(_principals(kind.claims(policy, other, nobody), policy))
            held_in_all += len(held[-1])
            if bounds is not None and held_in_all > bounds.max_held:
                held_over(held_in_all, bounds)
        inverse: dict[str, set[int]] = defaultdict(set)
        for index, holds in enumerate(held):
            _in_time(deadline)
            for principal in holds:
                inverse[principal].add(index)
        principals.append(held)
        producers.append(inverse)
        readable.append({r: readable_regions(r, policy) for r in all_regions})

    found: dict[tuple[str, str, int], tuple[set[str], set[str]]] = defaultdict(
        lambda: (set(), set())
    )  # (tenant, region, atom) -> (gains, losses)
    by_signature: dict[tuple[str, str, tuple[str, ...]], list[str]] = defaultdict(list)
    for label, vis in in_force:
        by_signature[(vis.tenant, vis.region, tuple(sorted(set(vis.acl))))].append(label)
    reach: dict[str, tuple[set[str], set[int]]] = defaultdict(lambda: (set(), set()))
    for (tenant, region, acl), labels in by_signature.items():
        _in_time(deadline)
        seen = [set().union(*(producers[p].get(a, ()) for a in acl)) for p in (0, 1)]
        vis = Visibility(tenant, region, acl, as_of, None)
        reach[tenant][1].update(seen[0] | seen[1])
        # Regions times groups can run to millions of pairs within every bound of the
        # edit (a few thousand nested groups and also_reads entries): the deadline is
        # checked at each pair, not only per visibility, or the preview ran on, and grew
        # its findings, long past its time limit.
        for caller_region in all_regions:
            _in_time(deadline)
            if any(region in readable[p][caller_region] for p in (0, 1)):
                reach[tenant][0].add(caller_region)
            shown = [seen[p] if region in readable[p][caller_region] else set() for p in (0, 1)]
            for atom, gained in [(a, True) for a in shown[1] - shown[0]] + [
                (a, False) for a in shown[0] - shown[1]
            ]:
                _in_time(deadline)
                _confirm(vis, caller_region, principals, readable, atom, gained, as_of)
                found[(tenant, caller_region, atom)][0 if gained else 1].update(labels)
    _in_time(deadline)  # what ran long is not answered as if it had not

    tenants = tuple(sorted({vis.tenant for _, vis in in_force}))
    notes = _notes(policies, len(from_directory))
    by_tenant = {
        tenant: Coverage(
            (tenant,),
            sum(1 for _, vis in in_force if vis.tenant == tenant),
            tuple(region_names[r] for r in all_regions if r in reach[tenant][0]),
            sum(1 for a in reach[tenant][1] if atoms[a].kind == "group"),
            sum(1 for a in reach[tenant][1] if atoms[a].kind == "user"),
            notes,
        )
        for tenant in tenants
    }
    return PolicyDiff(
        base.version,
        new.version,
        as_of,
        Coverage(
            tenants,
            len(in_force),
            tuple(region_names[r] for r in all_regions),
            len(groups),
            len(users),
            notes,
        ),
        _merged(found, atoms, region_names),
        by_tenant,
    )


def _principals(claims: Mapping[str, Any], policy: Policy) -> frozenset[str]:
    try:
        return resolve_caller(claims, policy).principals
    except GatewayError as exc:
        if exc.code != "insufficient_claims":
            raise
        # The claims are the diff's own, built by the policy's claim names: the policy is
        # at fault, not the caller of the diff.
        problem = f"claims: no caller resolves under these claim names ({exc.detail})"
        raise GatewayError("invalid_policy", problem, extra={"problems": [problem]}) from None


def _confirm(
    vis: Visibility,
    region: str,
    principals: list[list[frozenset[str]]],
    readable: list[dict[str, frozenset[str]]],
    atom: int,
    gained: bool,
    as_of: dt.date,
) -> None:
    """The reference decision must agree with the set algebra, or the diff is wrong."""
    decided = [
        decide(Restriction(vis.tenant, principals[p][atom], readable[p][region], as_of), vis)
        for p in (0, 1)
    ]
    if decided[1].visible != gained or decided[0].visible == gained:
        raise AssertionError(f"policy diff disagrees with decide() for {vis!r}")


def _merged(
    found: Mapping[tuple[str, str, int], tuple[set[str], set[str]]],
    atoms: list[Atom],
    region_names: Mapping[str, str],
) -> tuple[Change, ...]:
    """One change per (tenant, regions, gains, losses) naming every atom it holds for, so a
    widened root group is one line rather than one per nested group and region. Regions
    are merged per atom first: every region of a change holds for every one of its atoms."""
    per_atom: dict[tuple[str, int, frozenset[str], frozenset[str]], set[str]] = defaultdict(set)
    for (tenant, region, atom), (gained, lost) in found.items():
        per_atom[(tenant, atom, frozenset(gained), frozenset(lost))].add(region)
    kinds: dict[tuple[str, frozenset[str], frozenset[str], frozenset[str]], list[int]] = (
        defaultdict(list)
    )
    for (tenant, atom, gains, losses), regions in per_atom.items():
        kinds[(tenant, frozenset(regions), gains, losses)].append(atom)
    changes = [
        Change(
            tenant,
            tuple(sorted(region_names[r] for r in regions)),
            tuple(sorted(atoms[a].name for a in members if atoms[a].kind == "group")),
            tuple(sorted(atoms[a].name for a in members if atoms[a].kind == "user")),
            tuple(sorted(gains)),
            tuple(sorted(losses)),
        )
        for (tenant, regions, gains, losses), members in kinds.items()
    ]
    return tuple(sorted(changes, key=lambda c: (c.tenant, -len(c.gains), c.regions, c.groups)))


def _named_regions(policies: Iterable[Policy], document_regions: Iterable[str]) -> set[str]:
    named = set(document_regions)
    for policy in policies:
        named.add(policy.regions.global_region)
        for region, also in policy.regions.also_reads.items():
            named.update((region, *also))
    return named


def _named_groups_and_users(
    policies: Iterable[Policy], acls: Iterable[tuple[str, ...]]
) -> tuple[set[str], set[str]]:
    groups: set[str] = set()
    users: set[str] = set()
    for policy in policies:
        for child, parents in policy.nested_groups.items():
            groups.update((child, *parents))
        groups.update(grant.group for grant in policy.grants)
    for acl in acls:
        for principal in acl:
            kind, _, name = principal.partition(":")
            if kind == "group":
                groups.add(name)
            elif kind == "user":
                users.add(name)
    return groups, users


def _unused(stem: str, taken: set[str]) -> str:
    """A name none of `taken` is: the stand-in for every name the policies do not know."""
    name, n = stem, 0
    while name in taken:
        n += 1
        name = f"{stem}-{n}"
    return name


def _notes(policies: tuple[Policy, Policy], directory_groups: int = 0) -> tuple[str, ...]:
    notes = [
        "callers: every region named by a document or either policy, and any other; "
        "every group either policy or an ACL names, every group of the directory, and "
        "every user an ACL names; a group or user named nowhere changes no decision",
        "API keys keep the principals they were created with and are not listed",
    ]
    if directory_groups:
        notes.append(f"{directory_groups} groups of the directory (SCIM) are among the callers")
    base, new = policies
    if base.claims != new.claims:
        notes.append(
            "the policies read identity from different claims: callers are compared by the "
            "names they hold under each policy's claims"
        )
    return tuple(notes)
