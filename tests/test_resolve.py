"""Claims -> caller under the shipped default policy, as a decision table."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import GatewayError
from gateway.policy.loader import load_policy
from gateway.policy.model import Grant, Policy, Regions
from gateway.policy.resolve import resolve_caller

DEFAULT = load_policy(None).policy
BASE: dict[str, Any] = {"sub": "ann", "tenant": "acme", "region": "EU"}


def test_subject_and_groups_become_principals_and_own_region_only() -> None:
    caller = resolve_caller({**BASE, "groups": ["staff", "eu-ops"]}, DEFAULT)
    assert caller.principals == {"user:ann", "group:staff", "group:eu-ops"}
    assert caller.readable_regions == {"EU"}  # GLOBAL is not readable by default


@pytest.mark.parametrize("missing", ["sub", "tenant", "region"])
def test_missing_or_unusable_identity_claim_is_403(missing: str) -> None:
    for bad in (None, "", "   ", 42, ["acme"], "ac\x00me"):
        claims = (
            {**BASE, missing: bad}
            if bad is not None
            else {k: v for k, v in BASE.items() if k != missing}
        )
        with pytest.raises(GatewayError) as error:
            resolve_caller(claims, DEFAULT)
        assert error.value.code == "insufficient_claims"


@pytest.mark.parametrize("groups", [None, [], "staff", [1, None, "", "bad\x00group"], {"a": 1}])
def test_malformed_groups_grant_nothing(groups: Any) -> None:
    claims = {**BASE} if groups is None else {**BASE, "groups": groups}
    assert resolve_caller(claims, DEFAULT).principals == {"user:ann"}


def test_grants_global_region_and_extra_regions_come_only_from_policy() -> None:
    policy = Policy(
        grants=(Grant(group="support-eu", grants=("support:eu",)),),
        regions=Regions(global_readable=True, also_reads={"EU": ("UK",)}),
    )
    caller = resolve_caller({**BASE, "groups": ["support-eu"]}, policy)
    assert "support:eu" in caller.principals
    assert caller.readable_regions == {"EU", "UK", "GLOBAL"}
    # A claim cannot name its own grants or regions.
    other = resolve_caller({**BASE, "groups": ["support:eu"], "regions": ["US"]}, DEFAULT)
    assert "support:eu" not in other.principals and other.readable_regions == {"EU"}


def test_shipped_policy_directory_matches_the_packaged_default() -> None:
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[1] / "policies"
    assert load_policy(shipped).policy == DEFAULT
