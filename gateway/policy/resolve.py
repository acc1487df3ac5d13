"""Claims -> Caller: principals and readable regions, each with the rule that produced it.

The decision table (docs/policy.md, "From claims to a caller"), applied in this order:

1. `sub`, `tenant` and `region` claims (names per `claims:`) must be usable strings (the
   rule of every name, gateway/domain.py `name_problem`), the tenant of at most
   MAX_TENANT_BYTES in UTF-8 and the others of MAX_SUBJECT_BYTES (the catalog indexes
   them), or the request is refused (403 insufficient_claims). The subject and groups are
   compared in NFC (`canonical_name`), as ACLs, the directory and the policy keep names.
2. Principals: `user:<sub>`; `group:<g>` for each group in the token (less those the
   directory withholds) and, for a caller the directory knows (SCIM,
   gateway/authn/directory.py), each directory group; `group:<p>` for each
   group `p` those are nested in (`nested_groups`, transitively); and the `grants` of any of
   those groups. A token cannot name its own grants, regions or admin rights.
3. Readable regions: the caller's region, the policy's `also_reads` for it, and the global
   region when `global_readable`.
4. Admin: the subject is in `admins.subjects`, or a (nested) group is in `admins.groups`.

Nothing else adds a principal; a caller matching no rule holds only `user:<sub>` and sees
only documents whose ACL names that user.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.domain import (
    MAX_SUBJECT_BYTES,
    MAX_TENANT_BYTES,
    Caller,
    canonical_name,
    name_problem,
)
from gateway.errors import GatewayError
from gateway.policy.model import Policy


def _usable(value: object) -> bool:
    """A string that could name something, by the rule every door follows (ingest's for
    ACLs too): not empty, no control characters, no whitespace at either end."""
    return isinstance(value, str) and name_problem(value) is None


def usable_claim(
    claims: Mapping[str, Any], name: str, max_bytes: int = MAX_SUBJECT_BYTES
) -> str | None:
    """The claim `name` when it is a usable string of at most `max_bytes` in UTF-8, else
    None (absent or unusable). The audit trail indexes a caller's subject and tenant: one
    beyond what PostgreSQL can index would fail the batch of records it is in, again and
    again, and with it every request that needs a record, of every tenant. Measured in
    NFC, the form a subject is kept in (it can be longer than the form sent)."""
    value = claims.get(name)
    usable = isinstance(value, str) and _usable(value) and _size(value) <= max_bytes
    return value if usable else None


def _size(value: str) -> int:
    return len(canonical_name(value).encode())


def _unusable(claims: Mapping[str, Any], name: str, max_bytes: int) -> str:
    """How the detail names an unusable claim: with its size when only that is wrong (never
    its value)."""
    value = claims.get(name)
    if isinstance(value, str) and _usable(value):
        return f"{name} ({_size(value)} bytes in UTF-8; the limit is {max_bytes})"
    return name


def expand_groups(groups: Iterable[str], nested: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """Every group reached from `groups` through nesting -> how it was reached.

    "groups" for a group the token names, "nested:<child>" for one reached through nesting.
    Breadth-first, so each group is reached by its shortest path; cycles end where they
    meet a group already reached."""
    reached = {g: "groups" for g in groups}
    frontier = list(reached)
    while frontier:
        following = []
        for group in frontier:
            for parent in nested.get(group, ()):
                if parent not in reached:
                    reached[parent] = f"nested:{group}"
                    following.append(parent)
        frontier = following
    return reached


@dataclass(frozen=True)
class DirectoryGroups:
    """What the tenant's directory says of a caller it knows (gateway/authn/directory.py):
    `held`, its groups there, held beside the token's; `withheld`, the groups of the
    token's `groups` claim that the directory manages and does not hold it in, which do
    not count. A value of its own, so that no claims are edited to narrow them."""

    held: tuple[str, ...] = ()
    withheld: frozenset[str] = frozenset()


def readable_regions(region: str, policy: Policy) -> frozenset[str]:
    """The caller's own region, what the policy lets it read besides, and the global one."""
    regions = {region, *policy.regions.also_reads.get(region, ())}
    if policy.regions.global_readable:
        regions.add(policy.regions.global_region)
    return frozenset(regions)


def resolve_caller(
    claims: Mapping[str, Any], policy: Policy, directory: DirectoryGroups | None = None
) -> Caller:
    """A caller whose claims map to no principal is valid and simply sees nothing.
    `directory` is what the directory says of a caller it knows: its groups there, held
    beside the token's, and the token's groups it withholds; a token with a groups overage
    marker and no `groups` claim holds the directory's alone."""
    names = policy.claims
    # The tenant is indexed beside doc_ids and versions, so it is bounded tighter.
    bounds = {
        names.subject: MAX_SUBJECT_BYTES,
        names.tenant: MAX_TENANT_BYTES,
        names.region: MAX_SUBJECT_BYTES,
    }
    usable = {name: usable_claim(claims, name, most) for name, most in bounds.items()}
    subject, tenant, region = usable[names.subject], usable[names.tenant], usable[names.region]
    missing = [_unusable(claims, name, bounds[name]) for name, v in usable.items() if v is None]
    if subject is None or tenant is None or region is None:
        # A claim that is there but unusable (123, a list, "", a control character, too
        # many bytes) is refused too: "missing" alone would send whoever debugs the token
        # the wrong way.
        detail = f"missing or unusable claims: {', '.join(missing)}"
        raise GatewayError("insufficient_claims", detail)
    # NFC, as ACLs and the directory keep user names: one user however its accents are sent.
    subject = canonical_name(subject)

    raw_groups = claims.get(names.groups, [])
    # A malformed groups claim grants nothing rather than failing the request.
    listed = raw_groups if isinstance(raw_groups, list) else []
    directory = directory or DirectoryGroups()
    # NFC, as ACLs, the directory and the policy keep names.
    named = [canonical_name(g) for g in listed if _usable(g)]
    groups = [g for g in named if g not in directory.withheld]
    held = (canonical_name(g) for g in directory.held if _usable(g))
    from_directory = [g for g in held if g not in groups]
    member_of = expand_groups([*groups, *from_directory], policy.nested_groups)
    for group in from_directory:
        member_of[group] = "directory"
    sources = {f"user:{subject}": "subject"}
    sources.update((f"group:{group}", how) for group, how in member_of.items())
    granted = policy.grants_of(member_of)
    for grant in granted:
        for principal in grant.grants:
            sources.setdefault(principal, f"grant:{grant.group}")

    # Rule kinds only: a trace needs which rules fired, not thousands of group names.
    reasons = ["subject"]
    reasons += ["groups"] if groups else []
    reasons += ["directory"] if from_directory else []
    reasons += ["nested"] if len(member_of) > len(set(groups) | set(from_directory)) else []
    reasons += ["grant"] if granted else []
    reasons += ["global_readable"] if policy.regions.global_readable else []
    groups_held = set(member_of)
    admins, operators = policy.admins, policy.operators
    own_tenant = admins.tenants.get(tenant)
    admin = admins.match(subject, groups_held) or (
        own_tenant is not None and own_tenant.match(subject, groups_held)
    )
    operator = tenant == operators.tenant and operators.match(subject, groups_held)
    return Caller(
        subject=subject,
        tenant=tenant,
        region=region,
        principals=frozenset(sources),
        readable_regions=readable_regions(region, policy),
        reasons=tuple(reasons),
        sources=tuple(sources.items()),
        admin=admin,
        operator=operator,
    )
