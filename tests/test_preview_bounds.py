"""POST /admin/policy/preview within bounds: any tenant admin may call it, so the edited
files are bounded before they are parsed and the policy before it is diffed (422
preview_too_large, naming the bound), anchors and aliases are refused, a tenant runs one
preview at a time (429 preview_busy), a diff past its time limit stops (503
preview_timeout), and the answer concerns the admin's own tenant only."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.api.state import AppState
from gateway.embedding import Embedder
from tests.helpers.callers import EVE, ROOT
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.policies import write_policy

Serve = Callable[..., TestClient]


@pytest.fixture
def serve(tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder) -> Iterator[Serve]:
    """An app serving the tests' policy with `changes`."""
    with ExitStack() as stack:

        def started(**changes: Any) -> TestClient:
            policy_dir = write_policy(tmp_path / f"policy-{len(changes)}", **changes)
            settings = make_settings(data_dir, jwks_file, policy_dir).model_copy(
                update={"policy_watch_interval_s": 0.0}
            )
            return stack.enter_context(TestClient(create_app(settings, embedder=embedder)))

        yield started


def state_of(client: TestClient) -> AppState:
    state: AppState = client.app.state.gateway  # type: ignore[attr-defined]
    return state


def grants(count: int, per_grant: int = 1) -> str:
    """`count` one-line grants, each of its own group."""
    lines = (
        f"- {{group: g{i}, grants: [{', '.join(f'p:{i}-{j}' for j in range(per_grant))}]}}\n"
        for i in range(count)
    )
    return "grants:\n" + "".join(lines)


def shipped(tmp_path: Path, **changes: Any) -> str:
    """The serving policy's file with `changes`, as an admin's editor would send it."""
    return (write_policy(tmp_path / "edited", **changes) / "policy.yaml").read_text()


def preview(
    client: TestClient, files: dict[str, str], claims: dict[str, Any], tokens: TokenFactory
):
    return client.post(
        "/admin/policy/preview", json={"files": files}, headers=bearer(tokens(**claims))
    )


def problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["code"] == code
    return body


def test_an_edit_that_took_a_minute_is_refused_before_it_is_parsed(
    serve: Serve, make_token: TokenFactory
) -> None:
    client = serve()
    files = {"policy.yaml": grants(20_000)}  # 758 KB: a minute of CPU before the bounds
    size = len(files["policy.yaml"].encode())
    refused = problem(preview(client, files, ROOT, make_token), 422, "preview_too_large")
    # Only the size is named: the grants were never counted, so the text was never parsed.
    assert refused["problems"] == [
        f"files: {size} bytes of text, over the bound of 524288 (preview.max_bytes)"
    ]
    assert state_of(client).previews.running() == 0


def test_counts_and_nesting_past_the_bounds_are_refused_naming_each_bound(
    tmp_path: Path, serve: Serve, make_token: TokenFactory
) -> None:
    client = serve()
    many = problem(
        preview(client, {"p.yaml": grants(6000)}, ROOT, make_token), 422, "preview_too_large"
    )
    assert many["problems"] == [
        "grants: 6000 entries, over the bound of 5000 (preview.max_grants)",
        "nested_groups and grants: 6000 groups, over the bound of 5000 (preview.max_groups)",
    ]
    wide = problem(
        preview(client, {"p.yaml": grants(2, per_grant=10_001)}, ROOT, make_token),
        422,
        "preview_too_large",
    )
    assert wide["problems"] == [
        "grants, nested_groups, regions: 20002 rules, over the bound of 20000 (preview.max_rules)"
    ]
    chain = {f"c{i}": [f"c{i + 1}"] for i in range(20)}  # 21 groups deep
    deep = problem(
        preview(client, {"p.yaml": shipped(tmp_path, nested_groups=chain)}, ROOT, make_token),
        422,
        "preview_too_large",
    )
    assert deep["problems"] == [
        "nested_groups: 21 groups deep, over the bound of 16 (preview.max_nesting_depth)"
    ]
    files = {f"p{i:02}.yaml": "{}\n" for i in range(17)}
    split = problem(preview(client, files, ROOT, make_token), 422, "preview_too_large")
    assert split["problems"] == ["files: 17 files, over the bound of 16 (preview.max_files)"]

    # At the bounds, the preview answers; and the serving policy may set other bounds.
    at = preview(client, {"p.yaml": grants(5000)}, ROOT, make_token)
    assert at.status_code == 200, at.text
    assert at.json()["widens"] is False
    tight = serve(preview={"max_grants": 10})
    problem(preview(tight, {"p.yaml": grants(11)}, ROOT, make_token), 422, "preview_too_large")


def test_anchors_and_aliases_in_an_edit_are_refused(serve: Serve, make_token: TokenFactory) -> None:
    client = serve()
    items = ", ".join(["x"] * 10_000)
    aliases = ", ".join(["*l"] * 100)  # 100 aliases of a 10,000-item list
    bomb = f"nested_groups: {{big: &l [{items}]}}\nregions: {{also_reads: {{EU: [{aliases}]}}}}\n"
    refused = problem(
        preview(client, {"policy.yaml": bomb}, ROOT, make_token), 422, "invalid_policy"
    )
    assert refused["problems"] == [
        "policy.yaml: not valid YAML at line 1: anchors and aliases (& and *) are not accepted"
    ]


def test_a_tenant_runs_one_preview_at_a_time(
    tmp_path: Path, serve: Serve, make_token: TokenFactory
) -> None:
    client = serve()
    gate, bounds = state_of(client).previews, state_of(client).policy.policy.preview
    files = {"policy.yaml": shipped(tmp_path)}
    held = gate.admit("acme", bounds)  # a preview of acme's, still running
    try:
        busy = preview(client, files, ROOT, make_token)
        assert "your tenant" in problem(busy, 429, "preview_busy")["detail"]
        assert 1 <= int(busy.headers["Retry-After"]) <= bounds.timeout_s
        # Another tenant's admin is not held up by acme's preview.
        assert preview(client, files, EVE, make_token).status_code == 200
    finally:
        gate.release("acme", held)
    assert preview(client, files, ROOT, make_token).status_code == 200
    assert gate.running() == 0


def test_every_tenant_together_runs_a_bounded_number(
    tmp_path: Path, serve: Serve, make_token: TokenFactory
) -> None:
    client = serve(preview={"max_concurrent": 1})
    gate, bounds = state_of(client).previews, state_of(client).policy.policy.preview
    held = gate.admit("initech", bounds)
    try:
        busy = preview(client, {"policy.yaml": shipped(tmp_path)}, EVE, make_token)
        assert "as many previews" in problem(busy, 429, "preview_busy")["detail"]
    finally:
        gate.release("initech", held)


def test_a_preview_past_its_time_limit_stops_with_503(
    serve: Serve, make_token: TokenFactory
) -> None:
    client = serve(preview={"timeout_s": 0.001})  # no parse of 3,000 grants is that quick
    late = preview(client, {"policy.yaml": grants(3000)}, ROOT, make_token)
    timed_out = problem(late, 503, "preview_timeout")
    assert "preview.timeout_s" in timed_out["detail"]
    assert state_of(client).previews.running() == 0  # its slot is free again


def test_a_preview_of_many_regions_times_many_groups_stops_at_its_time_limit(
    serve: Serve, make_token: TokenFactory, tmp_path: Path
) -> None:
    """1,000 groups nested in `staff` (on a document's ACL) and 1,000 regions that read
    EU: within every bound of the edit, a million (region, group) pairs each document's
    visibility is checked for. The time limit was checked once per visibility, so the
    diff ran 15 s on, and grew to 660 MB, past a 1 s limit; it stops at the limit now."""
    client = serve(preview={"timeout_s": 1.0})
    edit = shipped(
        tmp_path,
        nested_groups={f"g{i}": ["staff"] for i in range(1000)},
        regions={"also_reads": {f"R{i}": ["EU"] for i in range(1000)}},
    )
    began = time.monotonic()
    late = preview(client, {"policy.yaml": edit}, ROOT, make_token)
    problem(late, 503, "preview_timeout")
    assert time.monotonic() - began < 6  # the limit and the edit's parse, not 15 s
    assert state_of(client).previews.running() == 0


def test_the_preview_concerns_the_admins_own_tenant_only(
    tmp_path: Path, serve: Serve, make_token: TokenFactory
) -> None:
    client = serve()
    base = yaml.safe_load(shipped(tmp_path))
    plain = preview(client, {"policy.yaml": shipped(tmp_path)}, ROOT, make_token)
    assert plain.status_code == 200, plain.text
    # What the shared policy says about regions and groups no acme document is in or
    # readable by: other tenants' business, absent from acme's answer.
    elsewhere = shipped(
        tmp_path,
        nested_groups={**base.get("nested_groups", {}), "globex-analysts": ["globex-staff"]},
        grants=[*base.get("grants", []), {"group": "globex-staff", "grants": ["globex:ledger"]}],
        regions={**base["regions"], "also_reads": {"APAC": ["JP"]}},
    )
    edited = preview(client, {"policy.yaml": elsewhere}, ROOT, make_token)
    assert edited.status_code == 200, edited.text
    covers = edited.json()["covers"]
    assert not {"APAC", "JP"} & set(covers["regions"])
    assert covers == plain.json()["covers"]
    assert edited.json()["changes"] == [] and edited.json()["widens"] is False


def test_a_lone_surrogate_or_a_claim_mapping_that_fails_is_invalid_policy(
    tmp_path: Path, serve: Serve, make_token: TokenFactory
) -> None:
    client = serve()
    raw = b'{"files": {"policy.yaml": "grants: []\\n# \\ud800\\n"}}'
    surrogate = client.post(
        "/admin/policy/preview",
        content=raw,
        headers={**bearer(make_token(**ROOT)), "Content-Type": "application/json"},
    )
    body = problem(surrogate, 422, "invalid_policy")
    assert body["problems"] == ["policy.yaml: not text: an unpaired surrogate at 13"]

    # One claim for both the subject and the groups: no caller resolves under it. The
    # policy is at fault, not the admin who asks (it was 403 insufficient_claims).
    clash = shipped(tmp_path, claims={"subject": "groups"})
    refused = problem(
        preview(client, {"policy.yaml": clash}, ROOT, make_token), 422, "invalid_policy"
    )
    assert any(p.startswith("policy.yaml: claims: ") for p in refused["problems"])
    assert any("four different claims" in p for p in refused["problems"])


def test_a_nesting_that_closes_a_cycle_through_every_group_is_named_briefly(
    tmp_path: Path, serve: Serve, make_token: TokenFactory
) -> None:
    """Every group nested in the next and in g0: its cycles' groups grow with the square
    of its size (a 61 KB edit made a 38 MB problem text). A few cycles are named, a long
    one by its ends, and the rest counted."""
    client = serve()
    nested = {"g0": ["g1"], **{f"g{i}": [f"g{i + 1}", "g0"] for i in range(1, 3000)}}
    edited = shipped(tmp_path, nested_groups=nested)
    body = problem(
        preview(client, {"policy.yaml": edited}, ROOT, make_token), 422, "invalid_policy"
    )
    cycles = [p for p in body["problems"] if "a cycle: " in p]
    assert len(cycles) == 1 and len(cycles[0]) < 2_000
    assert "g0 -> g1 -> g2" in cycles[0] and "more)" in cycles[0] and "and more (" in cycles[0]


def test_groups_that_each_hold_thousands_of_principals_are_refused_as_the_diff_resolves(
    serve: Serve, make_token: TokenFactory
) -> None:
    """Within every rule bound, 5,000 groups nested in one hub granted 15,000 principals
    make 75 million held: the preview grew to gigabytes before its time limit. The diff
    stops at `preview.max_held` instead, naming it, and holds nothing more."""
    client = serve()
    hub = [f"g{i}: [hub]" for i in range(4_999)]
    granted = ", ".join(f"p:{j}" for j in range(15_000))
    text = "nested_groups:\n" + "".join(f"  {line}\n" for line in hub)
    text += f"grants:\n  - {{group: hub, grants: [{granted}]}}\n"
    refused = problem(preview(client, {"p.yaml": text}, ROOT, make_token), 422, "preview_too_large")
    [said] = refused["problems"]
    assert said.startswith("the callers: ") and "(preview.max_held)" in said
    assert state_of(client).previews.running() == 0
    # A serving policy may allow more, or less: at a bound of 10, the shipped policy's
    # callers already hold more.
    tight = serve(preview={"max_held": 10})
    problem(preview(tight, {"p.yaml": "{}\n"}, ROOT, make_token), 422, "preview_too_large")


def test_regions_also_reads_names_count_as_rules_with_their_keys(
    serve: Serve, make_token: TokenFactory
) -> None:
    """A region key with an empty list is a region every change lists: 35,000 of them
    counted as no rule and made a 7 MB answer."""
    client = serve()
    keys = "".join(f"    R{i}: []\n" for i in range(20_001))
    text = f"regions:\n  global_readable: true\n  also_reads:\n{keys}"
    refused = problem(preview(client, {"p.yaml": text}, ROOT, make_token), 422, "preview_too_large")
    assert refused["problems"] == [
        "grants, nested_groups, regions: 20001 rules, over the bound of 20000 (preview.max_rules)"
    ]
