"""Claims -> caller under the shipped default policy, as a decision table."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import GatewayError
from gateway.policy.loader import load_policy
from gateway.policy.model import Admins, Grant, Policy, Regions
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


NESTED = Policy(
    nested_groups={
        "support-eu": ("support",),
        "support": ("staff",),
        "ops": ("gateway-admins",),
    },
    grants=(
        Grant(group="support", grants=("support:all",)),
        Grant(group="support-eu", grants=("support:eu",)),
    ),
    admins=Admins(subjects=("root",), groups=("gateway-admins",)),
)


@pytest.mark.parametrize(
    ("groups", "sub", "principals", "admin"),
    [
        # The decision table (docs/policy.md, "From claims to a caller"): claim groups, then
        # nesting, then grants.
        ([], "ann", {"user:ann"}, False),
        (["staff"], "ann", {"user:ann", "group:staff"}, False),  # nesting goes upwards only
        (["support"], "ann", {"user:ann", "group:support", "group:staff", "support:all"}, False),
        (
            ["support-eu"],
            "ann",
            {
                "user:ann",
                "group:support-eu",
                "group:support",
                "group:staff",
                "support:eu",
                "support:all",
            },
            False,
        ),
        (["ops"], "ann", {"user:ann", "group:ops", "group:gateway-admins"}, True),
        ([], "root", {"user:root"}, True),
        (["gateway-admins-not"], "ann", {"user:ann", "group:gateway-admins-not"}, False),
    ],
)
def test_nesting_grants_and_admins(
    groups: list[str], sub: str, principals: set[str], admin: bool
) -> None:
    caller = resolve_caller({**BASE, "sub": sub, "groups": groups}, NESTED)
    assert caller.principals == principals
    assert caller.admin is admin


def test_a_nesting_cycle_is_refused_naming_it() -> None:
    # Every group on a cycle would hold every other's documents: always a mistake.
    with pytest.raises(ValueError, match=r"cycle: a -> b -> c -> a; x -> x"):
        Policy(nested_groups={"a": ("b",), "b": ("c",), "c": ("a",), "x": ("x",), "y": ("a",)})


def test_each_principal_names_the_rule_that_gave_it() -> None:
    caller = resolve_caller({**BASE, "groups": ["support-eu"]}, NESTED)
    assert dict(caller.sources) == {
        "user:ann": "subject",
        "group:support-eu": "groups",
        "group:support": "nested:support-eu",
        "group:staff": "nested:support",
        "support:eu": "grant:support-eu",
        "support:all": "grant:support",
    }
    assert caller.reasons == ("subject", "groups", "nested", "grant")


def test_claims_cannot_make_an_admin() -> None:
    for claims in ({"admin": True}, {"roles": ["gateway-admins"]}, {"groups": ["group:ops"]}):
        assert resolve_caller({**BASE, **claims}, NESTED).admin is False


def test_five_thousand_groups_expand_without_a_huge_token() -> None:
    policy = Policy(nested_groups={"everyone": tuple(f"team-{i}" for i in range(5000))})
    caller = resolve_caller({**BASE, "groups": ["everyone"]}, policy)
    assert len(caller.principals) == 5002


class CountedGrants(tuple[Grant, ...]):
    """The policy's grants, counting the passes made over all of them."""

    passes = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        CountedGrants.passes += 1
        return super().__iter__()


def test_grants_are_found_by_group_not_by_a_pass_over_every_grant() -> None:
    # A policy diff resolves one caller per group: a pass over every grant per caller made
    # 20,000 one-line grants cost a minute of CPU (the square of the input).
    grants = CountedGrants(Grant(group=f"team-{i}", grants=(f"perm:{i}",)) for i in range(2000))
    policy = Policy.model_construct(grants=grants)
    CountedGrants.passes = 0
    for i in range(0, 2000, 7):
        caller = resolve_caller({**BASE, "groups": [f"team-{i}", "staff"]}, policy)
        assert caller.principals == {"user:ann", "group:staff", f"group:team-{i}", f"perm:{i}"}
    assert CountedGrants.passes <= 1  # the index, built once


def test_claim_names_that_share_a_claim_are_refused() -> None:
    with pytest.raises(ValueError, match="four different claims"):
        Policy.model_validate({"claims": {"subject": "groups"}})
