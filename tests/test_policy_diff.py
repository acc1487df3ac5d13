"""`gateway policy diff`: who gains and loses which documents, exact on hand-made cases
and against a brute force over every caller of small random worlds, computed here
without the gateway's resolution or `decide()`."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import sqlite3
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.domain import Visibility
from gateway.policy.diff import OTHER_REGION, PolicyDiff, diff_policies, render_table
from gateway.policy.loader import LoadedPolicy
from gateway.policy.model import Policy
from tests.helpers.datadirs import copy_data_dir
from tests.helpers.properties import examples

TODAY = dt.date(2026, 11, 24)
OPEN = dt.date(2020, 1, 1)


def loaded(version: str, **policy: Any) -> LoadedPolicy:
    return LoadedPolicy(Policy.model_validate(policy), version, ("policy.yaml",))


def vis(tenant: str, region: str, *acl: str, start: dt.date = OPEN, end: dt.date | None = None):
    return Visibility(tenant, region, acl, start, end)


BASE = {
    "nested_groups": {"support-eu": ["support"], "support": ["staff"], "interns": ["staff"]},
    "grants": [{"group": "support", "grants": ["ticket:eu"]}],
    "regions": {"also_reads": {"EU": ["GLOBAL"]}},
}
NEW = {  # contractors become staff with the ticket grant; interns leave; EU reads US
    "nested_groups": {"support-eu": ["support"], "support": ["staff"], "contractors": ["staff"]},
    "grants": [
        {"group": "support", "grants": ["ticket:eu"]},
        {"group": "contractors", "grants": ["ticket:eu"]},
    ],
    "regions": {"also_reads": {"EU": ["GLOBAL", "US"]}},
}
VERSIONS = [
    ("handbook", "1", vis("acme", "EU", "group:staff")),
    ("tickets", "1", vis("acme", "EU", "ticket:eu")),
    ("us-plan", "1", vis("acme", "US", "group:staff")),
    ("ann-note", "1", vis("acme", "US", "user:ann")),
    ("old-memo", "1", vis("acme", "EU", "group:staff", end=dt.date(2025, 1, 1))),
    ("future", "1", vis("acme", "EU", "group:staff", start=dt.date(2099, 1, 1))),
    ("beta-doc", "1", vis("beta", "EU", "group:staff")),
]


def rows(diff: PolicyDiff) -> set[tuple[Any, ...]]:
    return {(c.tenant, c.regions, c.groups, c.users, c.gains, c.losses) for c in diff.changes}


def test_nesting_grants_regions_and_dates_give_exactly_the_expected_changes() -> None:
    diff = diff_policies(loaded("base", **BASE), loaded("new", **NEW), VERSIONS, TODAY)
    assert rows(diff) == {
        ("acme", ("EU",), ("contractors",), (), ("handbook@1", "tickets@1", "us-plan@1"), ()),
        ("acme", ("US",), ("contractors",), (), ("us-plan@1",), ()),
        ("acme", ("EU",), ("staff", "support", "support-eu"), (), ("us-plan@1",), ()),
        ("acme", ("EU",), (), ("ann",), ("ann-note@1",), ()),
        ("acme", ("EU",), ("interns",), (), (), ("handbook@1",)),
        ("acme", ("US",), ("interns",), (), (), ("us-plan@1",)),
        ("beta", ("EU",), ("contractors",), (), ("beta-doc@1",), ()),
        ("beta", ("EU",), ("interns",), (), (), ("beta-doc@1",)),
    }
    assert diff.widens
    assert diff.totals("acme") == (4, 2)
    covered = diff.coverage
    assert covered.tenants == ("acme", "beta") and covered.documents == 5  # two out of force
    assert set(covered.regions) == {"EU", "US", "GLOBAL", OTHER_REGION}
    assert (covered.groups, covered.users) == (5, 1)  # staff, support(-eu), interns, contractors

    back = diff_policies(loaded("new", **NEW), loaded("base", **BASE), VERSIONS, TODAY)
    assert {(t, r, g, u, lost, gained) for t, r, g, u, gained, lost in rows(back)} == rows(diff)


def test_the_date_decides_which_versions_count() -> None:
    later = diff_policies(
        loaded("base", **BASE), loaded("new", **NEW), VERSIONS, dt.date(2099, 6, 1)
    )
    assert any("future@1" in c.gains for c in later.changes)  # in force by then
    earlier = diff_policies(
        loaded("base", **BASE), loaded("new", **NEW), VERSIONS, dt.date(2024, 6, 1)
    )
    assert any("old-memo@1" in c.losses for c in earlier.changes)  # interns lose it then


def test_an_unchanged_or_narrowing_policy_does_not_widen() -> None:
    same = diff_policies(loaded("a", **BASE), loaded("b", **BASE), VERSIONS, TODAY)
    assert same.changes == () and not same.widens
    narrower = {**BASE, "grants": []}
    narrowed = diff_policies(loaded("a", **BASE), loaded("b", **narrower), VERSIONS, TODAY)
    assert not narrowed.widens
    assert rows(narrowed) == {
        ("acme", ("EU",), ("support", "support-eu"), (), (), ("tickets@1",)),
    }


def test_global_readable_opens_the_global_region_to_every_region() -> None:
    versions = [("notice", "1", vis("acme", "GLOBAL", "group:staff"))]
    opened = {**BASE, "regions": {"global_readable": True}}
    diff = diff_policies(loaded("a", **BASE), loaded("b", **opened), versions, TODAY)
    # EU already read GLOBAL; every other region now does (US is named by nothing here).
    [change] = diff.changes
    assert change.regions == (OTHER_REGION,)
    assert change.groups == ("interns", "staff", "support", "support-eu")
    assert change.gains == ("notice@1",)


def test_the_table_names_ids_and_counts_and_says_what_it_covers() -> None:
    diff = diff_policies(loaded("base", **BASE), loaded("new", **NEW), VERSIONS, TODAY)
    table = render_table(diff)
    assert "policy base -> new, as of 2026-11-24" in table
    assert "covers 2 tenant(s), 5 version(s) in force" in table
    assert "callers in EU holding group:contractors" in table
    assert "gain 3: handbook@1, tickets@1, us-plan@1" in table
    assert table.rstrip().endswith("widens: yes, some caller gains a document")


# --- brute force over every caller of small random worlds --------------------------------

GROUPS = ["a", "b", "c", "d"]
REGIONS = ["EU", "US", "GLOBAL"]
USERS = ["u1", "u2"]
PRINCIPALS = [f"group:{g}" for g in GROUPS] + ["user:u1", "user:u2", "role:x"]


def policies() -> st.SearchStrategy[dict[str, Any]]:
    nested = st.dictionaries(
        st.sampled_from(GROUPS), st.lists(st.sampled_from(GROUPS), max_size=2), max_size=3
    ).map(  # nested only in later groups: no cycle, which a policy may not have
        lambda found: {child: [p for p in parents if p > child] for child, parents in found.items()}
    )
    grants = st.lists(
        st.fixed_dictionaries({"group": st.sampled_from(GROUPS), "grants": st.just(["role:x"])}),
        max_size=2,
    )
    regions = st.fixed_dictionaries(
        {
            "global_readable": st.booleans(),
            "also_reads": st.dictionaries(
                st.sampled_from(["EU", "US"]), st.lists(st.sampled_from(REGIONS), max_size=2)
            ),
        }
    )
    return st.fixed_dictionaries({"nested_groups": nested, "grants": grants, "regions": regions})


def documents() -> st.SearchStrategy[list[tuple[str, str, Visibility]]]:
    one = st.builds(
        lambda tenant, region, acl, future: Visibility(
            tenant, region, tuple(acl), dt.date(2099, 1, 1) if future else OPEN, None
        ),
        st.sampled_from(["t1", "t2"]),
        st.sampled_from(REGIONS),
        st.lists(st.sampled_from(PRINCIPALS), min_size=1, max_size=3),
        st.booleans(),
    )
    return st.lists(one, max_size=8).map(
        lambda found: [(f"d{i}", "1", v) for i, v in enumerate(found)]
    )


def sees(
    policy: dict[str, Any], subject: str, region: str, groups: set[str], v: Visibility
) -> bool:
    """The rules of docs/policy.md, "From claims to a caller" and docs/policy.md, "Visibility:
    decide()", written out again here."""
    held, frontier = set(groups), list(groups)
    while frontier:
        parent_of = policy["nested_groups"].get(frontier.pop(), [])
        for parent in parent_of:
            if parent not in held:
                held.add(parent)
                frontier.append(parent)
    principals = {f"user:{subject}"} | {f"group:{g}" for g in held}
    for grant in policy["grants"]:
        if grant["group"] in held:
            principals.update(grant["grants"])
    readable = {region, *policy["regions"]["also_reads"].get(region, [])}
    if policy["regions"]["global_readable"]:
        readable.add("GLOBAL")
    return v.effective_from <= TODAY and v.region in readable and bool(principals & set(v.acl))


def seen_by(policy: dict[str, Any], tenant: str, subject: str, region: str, groups: set[str],
            versions: list[tuple[str, str, Visibility]]) -> set[str]:  # fmt: skip
    return {
        f"{d}@{n}"
        for d, n, v in versions
        if v.tenant == tenant and sees(policy, subject, region, groups, v)
    }


@settings(max_examples=examples(150), deadline=None)
@given(base=policies(), new=policies(), versions=documents())
def test_changes_match_a_brute_force_over_every_caller(
    base: dict[str, Any], new: dict[str, Any], versions: list[tuple[str, str, Visibility]]
) -> None:
    diff = diff_policies(loaded("a", **base), loaded("b", **new), versions, TODAY)
    reported: dict[tuple[str, str, str], tuple[set[str], set[str]]] = {}
    for change in diff.changes:
        atoms = [("group", g) for g in change.groups] + [("user", u) for u in change.users]
        for region, atom in itertools.product(change.regions, atoms):
            key = (change.tenant, region, f"{atom[0]}:{atom[1]}")
            assert key not in reported, "a caller listed twice"
            reported[key] = (set(change.gains), set(change.losses))

    widened = False
    for tenant in ("t1", "t2"):
        for region in [*REGIONS, "ELSEWHERE"]:
            shown = region if region in diff.coverage.regions else OTHER_REGION
            # Every single-group and single-user caller: exactly as reported.
            singles = [("nobody", {g}, f"group:{g}") for g in GROUPS]
            singles += [(u, set(), f"user:{u}") for u in USERS]
            for subject, groups, name in singles:
                before = seen_by(base, tenant, subject, region, groups, versions)
                after = seen_by(new, tenant, subject, region, groups, versions)
                expected = (after - before, before - after)
                got = reported.get((tenant, shown, name), (set(), set()))
                assert got == expected, (tenant, region, name)
            # Every caller at all: widens is exact.
            for size in range(len(GROUPS) + 1):
                for groups in map(set, itertools.combinations(GROUPS, size)):
                    for subject in [*USERS, "nobody"]:
                        before = seen_by(base, tenant, subject, region, groups, versions)
                        after = seen_by(new, tenant, subject, region, groups, versions)
                        widened |= bool(after - before)
    assert diff.widens == widened


def test_policy_files_load_as_the_server_loads_them(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(NEW))
    from gateway.policy.loader import load_policy

    diff = diff_policies(loaded("base", **BASE), load_policy(tmp_path), VERSIONS, TODAY)
    assert diff.widens and diff.new_version == load_policy(tmp_path).version


# --- the command, over a real catalog ------------------------------------------------------


def policy_dir(root: Path, **policy: Any) -> Path:
    root.mkdir()
    (root / "policy.yaml").write_text(yaml.safe_dump(policy))
    return root


def diff_command(data_dir: Path, *args: str) -> Any:
    from typer.testing import CliRunner

    from gateway.cli import app

    return CliRunner().invoke(app, ["policy", "diff", *args, "--data-dir", str(data_dir)])


def test_the_command_diffs_the_catalog_and_gates_a_widening(tmp_path: Path, data_dir: Path) -> None:
    base = policy_dir(tmp_path / "base")
    # Contractors become members of merchant-risk: they gain the restricted document.
    new = policy_dir(tmp_path / "new", nested_groups={"contractors": ["merchant-risk"]})
    shown = diff_command(data_dir, str(base), str(new), "--as-of", TODAY.isoformat())
    assert shown.exit_code == 0, shown.output
    assert "callers in EU holding group:contractors" in shown.output
    gains = next(line for line in shown.output.splitlines() if line.strip().startswith("gain "))
    assert "merchant-fraud@1" in gains  # the merchant-risk group's documents
    assert "widens: yes" in shown.output

    gated = diff_command(data_dir, str(base), str(new), "--fail-on-widen", "--json")
    assert gated.exit_code == 1
    body = json.loads(gated.output)
    assert body["widens"] is True and body["covers"]["tenants"] == ["acme", "globex"]
    [change] = body["changes"]
    assert change["groups"] == ["contractors"] and "merchant-fraud@1" in change["gains"]

    back = diff_command(data_dir, str(new), str(base), "--fail-on-widen")
    assert back.exit_code == 0 and "widens: no" in back.output and "merchant-fraud@1" in back.output


def test_the_command_refuses_bad_input_clearly(tmp_path: Path, data_dir: Path) -> None:
    base = policy_dir(tmp_path / "base")
    broken = policy_dir(tmp_path / "broken", nested_groups="no", bypass=True)
    refused = diff_command(data_dir, str(base), str(broken))
    assert refused.exit_code == 1
    assert "the new policy does not load" in refused.output
    assert "nested_groups" in refused.output and "bypass" in refused.output
    assert diff_command(data_dir, str(base), str(base), "--as-of", "soon").exit_code == 1

    outdated = tmp_path / "outdated"
    copy_data_dir(data_dir, outdated)
    with sqlite3.connect(outdated / "catalog.db") as db:
        db.execute("UPDATE alembic_version SET version_num = '0001'")
    old = diff_command(outdated, str(base), str(base))
    assert old.exit_code == 1 and "gateway db upgrade" in old.output

    foreign = tmp_path / "foreign"
    copy_data_dir(data_dir, foreign)
    with sqlite3.connect(foreign / "catalog.db") as db:
        db.execute("UPDATE generations SET model_name = 'another/model'")
    other = diff_command(foreign, str(base), str(base))
    assert other.exit_code == 1 and "another/model" in other.output
