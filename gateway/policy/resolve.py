"""Claims -> Caller: principals and readable regions, each with the rule that produced it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.domain import Caller
from gateway.errors import GatewayError
from gateway.policy.model import Policy


def _usable(value: object) -> bool:
    """A string that could name something: no control characters (refused at ingest too)."""
    return isinstance(value, str) and bool(value.strip()) and value.isprintable()


def _claim_str(claims: Mapping[str, Any], name: str) -> str | None:
    value = claims.get(name)
    return value if isinstance(value, str) and _usable(value) else None


def resolve_caller(claims: Mapping[str, Any], policy: Policy) -> Caller:
    """A caller whose claims map to no principal is valid and simply sees nothing."""
    names = policy.claims
    subject = _claim_str(claims, names.subject)
    tenant = _claim_str(claims, names.tenant)
    region = _claim_str(claims, names.region)
    missing = [
        n
        for n, v in ((names.subject, subject), (names.tenant, tenant), (names.region, region))
        if v is None
    ]
    if subject is None or tenant is None or region is None:
        raise GatewayError("insufficient_claims", f"missing claims: {', '.join(missing)}")

    raw_groups = claims.get(names.groups, [])
    # A malformed groups claim grants nothing rather than failing the request.
    groups = [g for g in raw_groups if _usable(g)] if isinstance(raw_groups, list) else []
    principals = {f"user:{subject}"} | {f"group:{g}" for g in groups}
    reasons = ["subject", *(["groups"] if groups else [])]
    for grant in policy.grants:
        if grant.group in groups:
            principals.update(grant.grants)
            reasons.append(f"grant:{grant.group}")

    regions = {region, *policy.regions.also_reads.get(region, ())}
    if policy.regions.global_readable:
        regions.add(policy.regions.global_region)
        reasons.append("global_readable")
    return Caller(
        subject=subject,
        tenant=tenant,
        region=region,
        principals=frozenset(principals),
        readable_regions=frozenset(regions),
        reasons=tuple(reasons),
    )
