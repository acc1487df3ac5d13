"""Policy files: strict parsing, clear problems, a content-hash version, and `policy check`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gateway.api.app import create_app
from gateway.api.routes import PUBLIC_PATHS
from gateway.cli import app as cli
from gateway.errors import GatewayError
from gateway.policy.loader import DEFAULT_POLICY_DIR, load_policy, load_policy_files, policy_schema
from gateway.policy.model import AUDITED_ROUTES, LANES
from gateway.retrieval.lanes.bm25 import Bm25Lane
from gateway.retrieval.lanes.dense import DenseLane
from gateway.retrieval.lanes.exact import ExactLane
from gateway.settings import Settings
from tests.helpers.policies import TOO_SHORT_MS, policy_with_budgets, write_policy

ROOT = Path(__file__).resolve().parents[1]
DEMO_POLICY_DIR = ROOT / "gateway" / "demo" / "policy"


NOT_A_NUMBER = "Value error, must be a number, written as one (not true/false, not quoted)"


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(text)
    return directory


def test_unknown_keys_are_refused_naming_file_and_key(tmp_path: Path) -> None:
    policy = write(tmp_path, "budgets.yaml", "budgets:\n  bm25_ms: 100\n  bypass: true\n")
    with pytest.raises(GatewayError) as error:
        load_policy(policy)
    assert "budgets.yaml" in error.value.detail and "budgets.bypass" in error.value.detail


def test_a_key_set_in_two_files_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "budgets: {bm25_ms: 100}\n")
    write(tmp_path, "b.yaml", "budgets: {dense_ms: 100}\n")
    with pytest.raises(GatewayError, match="already set in a.yaml"):
        load_policy(tmp_path)


def test_version_is_a_content_hash(tmp_path: Path) -> None:
    write(tmp_path, "p.yaml", "budgets: {bm25_ms: 100}\n")
    first = load_policy(tmp_path).version
    assert load_policy(tmp_path).version == first
    write(tmp_path, "p.yaml", "budgets: {bm25_ms: 101}\n")
    assert load_policy(tmp_path).version != first


def test_policy_check_cli(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(cli, ["policy", "check", "policies"]).exit_code == 0
    bad = write(tmp_path / "bad", "p.yaml", "regions: {global_readable: maybe}\n")
    result = runner.invoke(cli, ["policy", "check", str(bad)])
    assert result.exit_code == 1 and "regions.global_readable" in result.output


def test_checked_in_schema_matches_the_models() -> None:
    checked_in = Path(__file__).resolve().parents[1] / "policies" / "schema.json"
    assert checked_in.read_text() == policy_schema(), "run `make schema` and commit it"
    schema = json.loads(checked_in.read_text())
    assert schema["additionalProperties"] is False  # unknown keys are refused
    assert {"nested_groups", "grants", "regions", "admins", "budgets"} <= set(schema["properties"])


def test_every_problem_in_every_file_is_named(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "regions: {global_readable: maybe}\nbypass: true\n")
    write(tmp_path, "b.yaml", "budgets: [not, a, mapping\n")
    write(tmp_path, "c.yaml", "- a list\n")
    write(tmp_path, "d.yaml", "regions: {}\nadmins: {groups: [ops], roles: [x]}\n")
    with pytest.raises(GatewayError) as error:
        load_policy(tmp_path)
    lines = error.value.detail.splitlines()
    expected = [
        ("b.yaml", "not valid YAML"),
        ("c.yaml", "top level must be a mapping"),
        ("d.yaml", "regions: already set in a.yaml"),
        ("a.yaml", "regions.global_readable"),
        ("a.yaml", "bypass"),
        ("d.yaml", "admins.roles"),
    ]
    for name, words in expected:
        assert any(name in line and words in line for line in lines), (name, words, lines)
    result = CliRunner().invoke(cli, ["policy", "check", str(tmp_path)])
    assert result.exit_code == 1
    assert all(name in result.output for name in ("a.yaml", "b.yaml", "c.yaml", "d.yaml"))


@pytest.mark.parametrize("text", ["", "\n  \n", "# budgets: {bm25_ms: 100}\n"])
def test_an_empty_policy_file_is_refused_not_taken_for_every_default(
    tmp_path: Path, text: str
) -> None:
    """An emptied file (a failed deploy, a truncating editor) is a mistake far more often
    than a wish for every default; `{}` states the wish."""
    write(tmp_path, "a.yaml", "budgets: {bm25_ms: 100}\n")
    write(tmp_path, "policy.yaml", text)
    with pytest.raises(GatewayError) as error:
        load_policy(tmp_path)
    assert error.value.detail == (
        f"{tmp_path / 'policy.yaml'}: empty (no YAML document); write {{}} for a file that "
        "sets nothing"
    )
    write(tmp_path, "policy.yaml", "{}\n")
    assert load_policy(tmp_path).policy.budgets.bm25_ms == 100


def test_a_policy_file_that_cannot_be_read_is_named_with_the_other_problems(
    tmp_path: Path,
) -> None:
    """A directory named like a policy file (a backup, `old.yaml/`) or a file gone
    mid-deploy is a problem of the policy, reported as one: not a crash."""
    write(tmp_path, "a.yaml", "regions: {global_readable: maybe}\n")
    (tmp_path / "old.yaml").mkdir()
    with pytest.raises(GatewayError) as error:
        load_policy(tmp_path)
    lines = error.value.detail.splitlines()
    assert f"{tmp_path / 'old.yaml'}: cannot be read (Is a directory)" in lines
    assert any("a.yaml" in line and "regions.global_readable" in line for line in lines)
    result = CliRunner().invoke(cli, ["policy", "check", str(tmp_path)])
    assert result.exit_code == 1 and "old.yaml: cannot be read" in result.output


@pytest.mark.parametrize("directory", ["missing", "file.yaml"])
def test_a_directory_that_is_not_one_is_refused(tmp_path: Path, directory: str) -> None:
    (tmp_path / "file.yaml").write_text("budgets: {}\n")
    result = CliRunner().invoke(cli, ["policy", "check", str(tmp_path / directory)])
    assert result.exit_code == 1 and "not a directory" in result.output


# Defects of the policy's meaning: values that loaded but said something else.


def refused(tmp_path: Path, text: str) -> str:
    """The problems a one-file policy is refused with, as `gateway policy check` shows them."""
    write(tmp_path, "policy.yaml", text)
    with pytest.raises(GatewayError) as error:
        load_policy(tmp_path)
    assert error.value.code == "invalid_policy"
    result = CliRunner().invoke(cli, ["policy", "check", str(tmp_path)])
    assert result.exit_code == 1 and error.value.detail in result.output
    return error.value.detail.replace(f"{tmp_path / 'policy.yaml'}: ", "")


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        # the second `admins:` made every caller an admin; the first, further up, looked in force
        (
            "admins: {groups: [tenant-admins]}\ngrants: []\nadmins: {groups: [everyone]}\n",
            3,
            "'admins'",
        ),
        ("audit:\n  required: [/search, /answer]\n  required: []\n", 3, "'required'"),
        (
            "limits:\n  per_subject: {rate_per_s: 20, burst: 40}\n"
            "  per_subject: {rate_per_s: 1000000, burst: 1000000}\n",
            3,
            "'per_subject'",
        ),
        ("nested_groups: {on: [a], true: [b]}\n", 1, "True"),  # both are YAML 1.1's true
    ],
)
def test_a_key_given_twice_is_refused_naming_key_and_line(
    tmp_path: Path, text: str, line: int, key: str
) -> None:
    assert refused(tmp_path, text) == f"not valid YAML at line {line}: duplicate key {key}"


def test_a_key_given_twice_in_a_preview_is_one_of_its_problems() -> None:
    """POST /admin/policy/preview loads the files sent through load_policy_files."""
    with pytest.raises(GatewayError) as error:
        load_policy_files({"p.yaml": "admins: {groups: [a]}\nadmins: {groups: [b]}\n"})
    assert error.value.extra["problems"] == [
        "p.yaml: not valid YAML at line 2: duplicate key 'admins'"
    ]


def test_audit_required_names_routes_that_leave_a_record(tmp_path: Path) -> None:
    """A typo made /search serve without its record while the database refused records."""
    problem = refused(tmp_path, "audit: {required: [/serach, answer, /answer]}\n")
    assert problem.startswith(
        "audit.required: Value error, not a route that leaves an audit record: '/serach', "
        "'answer'; name route templates"
    )
    documented = ["/search", "/answer", "/documents/{doc_id}", "/chunks/{chunk_id}", "/mcp"]
    write(tmp_path, "policy.yaml", f"audit: {{required: {json.dumps(documented)}}}\n")
    assert load_policy(tmp_path).policy.audit.required == tuple(documented)
    write(tmp_path, "policy.yaml", "audit: {required: []}\n")  # never refuse: still allowed
    assert load_policy(tmp_path).policy.audit.required == ()


def _templates(routes: list[Any]) -> Iterator[str]:
    for route in routes:
        inner = getattr(route, "original_router", None)
        yield from _templates(list(inner.routes)) if inner is not None else [route.path_format]


def test_the_routes_audit_required_may_name_are_the_authenticated_routes() -> None:
    """Every route that authenticates its caller leaves a record (gateway/api/audit.py), so
    each may be required; a route added to the app must be added to AUDITED_ROUTES."""
    served = set(_templates(create_app(Settings()).routes))
    assert served - PUBLIC_PATHS == AUDITED_ROUTES
    assert {"/search", "/answer", "/mcp", "/v1/chat/completions"} <= AUDITED_ROUTES


def test_the_lanes_retrieval_weights_may_name_are_the_lanes() -> None:
    assert set(LANES) == {Bm25Lane.name, DenseLane.name, ExactLane.name}


@pytest.mark.parametrize(
    ("weights", "problem"),
    [
        (
            "{dens: 2.0}",
            "retrieval.weights: Value error, unknown lane 'dens'; the lanes are bm25, dense, exact",
        ),
        ("{bm25: .nan}", "retrieval.weights.bm25: Input should be a finite number"),
        ("{dense: .inf}", "retrieval.weights.dense: Input should be a finite number"),
        (
            "{bm25: 1, dense: -5}",
            "retrieval.weights: Value error, a weight must be 0 or more: 'dense'",
        ),
        (
            "{bm25: true}",
            f"retrieval.weights.bm25: {NOT_A_NUMBER}",
        ),
    ],
)
def test_retrieval_weights_are_of_known_lanes_finite_and_not_negative(
    tmp_path: Path, weights: str, problem: str
) -> None:
    assert refused(tmp_path, f"retrieval: {{fusion: weighted, weights: {weights}}}\n") == problem


def test_weights_of_zero_and_whole_numbers_still_load(tmp_path: Path) -> None:
    write(tmp_path, "policy.yaml", "retrieval: {weights: {bm25: 0, dense: 2, exact: 0.5}}\n")
    assert load_policy(tmp_path).policy.retrieval.weights == {"bm25": 0, "dense": 2, "exact": 0.5}


@pytest.mark.parametrize(
    ("text", "where"),
    [
        # a NaN threshold is never passed: the answer would never abstain
        ("answering: {min_relevance: .nan}\n", "answering.min_relevance"),
        ("answering: {min_relevance: -.inf}\n", "answering.min_relevance"),
        ("llm: {temperature: .nan}\n", "llm.temperature"),
        ("preview: {timeout_s: .inf}\n", "preview.timeout_s"),
    ],
)
def test_not_a_number_and_infinities_are_refused(tmp_path: Path, text: str, where: str) -> None:
    assert refused(tmp_path, text).startswith(f"{where}: Input should be a finite number")


@pytest.mark.parametrize(
    ("text", "problems"),
    [
        (
            "limits: {per_subject: {rate_per_s: true, burst: true}}\n",
            [
                f"limits.per_subject.rate_per_s: {NOT_A_NUMBER}",
                f"limits.per_subject.burst: {NOT_A_NUMBER}",
            ],
        ),
        (
            "budgets: {bm25_ms: yes}\n",
            [f"budgets.bm25_ms: {NOT_A_NUMBER}"],
        ),
        (
            "budgets: {bm25_ms: '300'}\n",
            [f"budgets.bm25_ms: {NOT_A_NUMBER}"],
        ),
        (
            "chunking: {max_tokens: on}\n",
            [f"chunking.max_tokens: {NOT_A_NUMBER}"],
        ),
        (
            "preview: {max_files: true}\n",
            [f"preview.max_files: {NOT_A_NUMBER}"],
        ),
        (
            "limits: {retrievals_per_tenant: true}\n",
            [f"limits.retrievals_per_tenant: {NOT_A_NUMBER}"],
        ),
    ],
)
def test_booleans_and_text_are_not_taken_for_numbers(
    tmp_path: Path, text: str, problems: list[str]
) -> None:
    """`rate_per_s: true` was a rate of 1 per second; `bm25_ms: '300'` only looked right."""
    assert [p.split(" [")[0] for p in refused(tmp_path, text).splitlines()] == problems


def test_whole_numbers_still_serve_where_fractions_are_allowed(tmp_path: Path) -> None:
    """And a whole number written with a fraction serves where one is asked, as before."""
    write(tmp_path, "policy.yaml", "limits: {per_subject: {rate_per_s: 5, burst: 10.0}}\n")
    rate = load_policy(tmp_path).policy.limits.per_subject
    assert rate is not None and (rate.rate_per_s, rate.burst) == (5.0, 10)
    assert "limits.per_subject.burst" in refused(
        tmp_path, "limits: {per_subject: {rate_per_s: 5, burst: 10.5}}\n"
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        # !!binary cm9vdA== was the subject "root", written so nobody reading would see it
        ("admins: {subjects: [!!binary cm9vdA==]}\n", "!!binary values are not accepted"),
        ("audit: {required: !!set {/search: null}}\n", "!!set values are not accepted"),
        ("operators: {tenant: !!timestamp 2024-01-01}\n", "!!timestamp values are not accepted"),
        ("admins: !!python/object:os.system {}\n", "!!python/object:os.system values are not"),
        ("admins: !local {}\n", "!local values are not accepted"),
        ("admins: {<<: {groups: [a]}, subjects: [b]}\n", "merge keys (<<) are not accepted"),
        # YAML 1.1 reads 1:30 as 90 (base 60): a budget of 90 ms nobody wrote
        ("budgets: {bm25_ms: 1:30}\n", "base-60 numbers (like 1:30, which YAML 1.1 reads as 90)"),
        ("budgets: {bm25_ms: !!float 1:30.5}\n", "base-60 numbers"),
    ],
)
def test_only_yaml_core_types_are_accepted(tmp_path: Path, text: str, problem: str) -> None:
    assert refused(tmp_path, text).startswith(f"not valid YAML at line 1: {problem}")


def test_yaml_forms_valid_policies_use_still_load(tmp_path: Path) -> None:
    """A plain date is the text it reads as (a tenant or group may be named so); YAML 1.1's
    yes/off, underscores and octal keep their meaning."""
    write(
        tmp_path,
        "policy.yaml",
        "operators: {tenant: 2024-01-01, groups: [ops]}\n"
        "regions: {global_readable: yes}\n"
        "retrieval: {flat_search_max_rows: 2_000_000, document_vector: off, rrf_k: 010}\n"
        "budgets: {bm25_ms: 250.5, llm_ms: !!int 1000}\n",
    )
    policy = load_policy(tmp_path).policy
    assert policy.operators.tenant == "2024-01-01" and policy.regions.global_readable is True
    retrieval = policy.retrieval
    assert (retrieval.flat_search_max_rows, retrieval.document_vector, retrieval.rrf_k) == (
        2_000_000,
        "off",
        8,
    )
    assert (policy.budgets.bm25_ms, policy.budgets.llm_ms) == (250.5, 1000)


@pytest.mark.parametrize("directory", [DEFAULT_POLICY_DIR, ROOT / "policies", DEMO_POLICY_DIR])
def test_the_shipped_policies_load(directory: Path) -> None:
    assert load_policy(directory).policy.audit.required == ("/search", "/answer")


def test_the_policies_the_tests_write_load(tmp_path: Path) -> None:
    assert load_policy(write_policy(tmp_path / "a")).policy.operators.tenant == "acme"
    budgets = load_policy(policy_with_budgets(tmp_path, bm25_ms=TOO_SHORT_MS)).policy.budgets
    assert budgets.bm25_ms == TOO_SHORT_MS


def test_numbers_in_exponent_form_still_load(tmp_path: Path) -> None:
    """YAML 1.1 reads `2e4` (no dot, or no exponent sign) as text: it loaded as 20000
    before numbers had to be written as numbers, and was then refused as a quoted one."""
    write(tmp_path, "policy.yaml", "budgets: {llm_ms: 2e4, bm25_ms: 1.5e2}\n")
    budgets = load_policy(tmp_path).policy.budgets
    assert (budgets.llm_ms, budgets.bm25_ms) == (20_000.0, 150.0)
    assert "budgets.llm_ms" in refused(tmp_path, "budgets: {llm_ms: '2e4'}\n")  # quoted
