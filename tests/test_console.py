"""The admins' console at /console, in a real browser: Playwright driving Debian's Chromium
against a real `gateway serve` process. Sign in, Try as (results, the rule that hides a
document, stage timings; under a directory matched on a claim of its own, the claim asked
for and why claims are refused), an impact preview of a widening edit, the index page; a
non-admin and an expired token are told so. The page has no powers of its own: every
call goes through the API's routes and checks.

Set CONSOLE_SCREENSHOTS=docs to refresh the screenshots of README.md, "For the admins who own
the policy" from this run.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.storage.layout import DataLayout
from tests.helpers.browser import chromium, console_page
from tests.helpers.callers import ALICE
from tests.helpers.documents import write_doc
from tests.helpers.identity import AUDIENCE, ISSUER, TokenFactory, bearer
from tests.helpers.policies import write_policy
from tests.helpers.processes import gateway_env, running_server, served_env
from tests.helpers.scim import GROUP, PATCH, USER, scim_key

pytestmark = pytest.mark.server

# An admin (nested in gateway-admins through ops) who also sees the merchant-risk documents.
ADMIN: dict[str, Any] = {"sub": "root", "groups": ["ops", "staff", "merchant-risk"]}
WIDENED = {"ops": ["gateway-admins"], "risk-eu": ["merchant-risk"], "staff": ["merchant-risk"]}


@pytest.fixture(scope="module")
def server(
    data_dir: Path, jwks_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    policy_dir = write_policy(tmp_path_factory.mktemp("console-policy"))
    env = gateway_env(
        GATEWAY_DATA_DIR=str(data_dir),
        GATEWAY_POLICY_DIR=str(policy_dir),
        GATEWAY_OIDC_ISSUER=ISSUER,
        GATEWAY_OIDC_AUDIENCE=AUDIENCE,
        GATEWAY_JWKS_URI=jwks_file.as_uri(),
        GATEWAY_JWT_LEEWAY_S="0",  # so a token can expire while the page is open
    )
    with running_server(env) as (base, _process):
        yield base, policy_dir


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Any, server: tuple[str, Path]) -> Iterator[Any]:
    with console_page(browser, server[0]) as opened:
        yield opened


def sign_in(page: Any, token: str) -> None:
    page.goto("/console")
    page.fill("#token", token)
    page.click("#sign-in-form button[type=submit]")


def snapshot(page: Any, tmp_path: Path, name: str) -> None:
    """A screenshot of the page as it is; into docs/ too when asked for."""
    shot = tmp_path / f"console-{name}.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000  # a rendered page, not a blank one
    target = os.environ.get("CONSOLE_SCREENSHOTS")
    if target:
        shutil.copy(shot, Path(__file__).resolve().parents[1] / target / shot.name)


def test_try_as_shows_results_the_hiding_rule_and_timings(
    page: Any, make_token: TokenFactory, tmp_path: Path
) -> None:
    sign_in(page, make_token(**ADMIN))
    page.wait_for_selector("#app:not([hidden])")
    assert "root · tenant acme" in page.inner_text("#who")
    claims = {"sub": "alice", "tenant": "acme", "region": "EU", "groups": ALICE["groups"]}
    page.fill("#claims", json.dumps(claims))
    page.fill("#query", "merchant fraud chargeback thresholds")
    page.click("#try-form button[type=submit]")
    hidden = page.wait_for_selector("#results tr[data-doc=merchant-fraud]")
    cells = hidden.inner_text()
    assert "hidden" in cells and "acl: none of their principals is on the ACL" in cells
    assert page.locator("#timings .bar").count() >= 3  # embed_query, bm25, dense, …
    assert "embed_query" in page.inner_text("#timings")
    snapshot(page, tmp_path, "try-as")


def test_a_widening_edit_is_previewed_with_the_documents_gained(
    page: Any, make_token: TokenFactory, server: tuple[str, Path], tmp_path: Path
) -> None:
    base, policy_dir = server
    sign_in(page, make_token(**ADMIN))
    page.click(".tab[data-panel=policy]")
    page.wait_for_selector("#policy-state dd")
    serving = httpx.get(f"{base}/readyz").json()["policy_version"]
    assert serving in page.inner_text("#policy-state")

    policy = yaml.safe_load((policy_dir / "policy.yaml").read_text())
    policy["nested_groups"] = WIDENED
    page.fill("#files .file-text", yaml.safe_dump(policy))
    page.click("#preview")
    banner = page.wait_for_selector(".banner")
    assert "Widens" in banner.inner_text()
    changes = page.inner_text("#changes")
    assert "group:staff" in changes and "merchant-fraud@1" in changes
    snapshot(page, tmp_path, "policy")
    assert httpx.get(f"{base}/readyz").json()["policy_version"] == serving  # nothing applied

    page.fill("#files .file-text", "nested_groups: {a: [b], b: [a]}\nbypass: true\n")
    page.click("#preview")
    refused = page.wait_for_selector("#preview-out .error")
    assert "cycle: a -> b -> a" in refused.inner_text() and "bypass" in refused.inner_text()


def test_the_index_page_shows_the_generation_and_the_tenants_counts(
    page: Any, make_token: TokenFactory, server: tuple[str, Path], tmp_path: Path
) -> None:
    sign_in(page, make_token(**ADMIN))
    page.click(".tab[data-panel=index]")
    page.wait_for_selector("#index-state dd")
    shown = page.inner_text("#index-state")
    generation = httpx.get(f"{server[0]}/readyz").json()["index_generation"]
    assert (
        f"Generation served\t{generation}" in shown or f"Generation served\n{generation}" in shown
    )
    assert "Documents" in shown and "Chunks" in shown
    snapshot(page, tmp_path, "index")


def test_a_non_admin_sees_only_that_and_an_expired_token_is_asked_for_again(
    page: Any, make_token: TokenFactory
) -> None:
    sign_in(page, make_token(**ALICE))
    error = page.wait_for_selector("#sign-in-error:has-text('Not an admin')")
    assert error.is_visible() and page.locator("#app").is_hidden()

    sign_in(page, make_token(**ADMIN, ttl=-3600))
    page.wait_for_selector("#sign-in-error:has-text('expired')")
    assert page.locator("#app").is_hidden()

    # A token that expires while the page is open: the next call says so.
    # Long enough to sign in on a loaded machine; then wait past its exp (the server
    # allows no leeway here).
    expires = time.time() + 6
    sign_in(page, make_token(**ADMIN, ttl=6))
    page.wait_for_selector("#app:not([hidden])")
    page.wait_for_timeout(max(0.0, expires - time.time() + 1) * 1000)
    page.fill("#query", "refunds")
    page.click("#try-form button[type=submit]")
    page.wait_for_selector("#sign-in-error:has-text('Paste a new one')")
    assert page.locator("#app").is_hidden()


def test_the_page_runs_only_its_own_code_and_holds_no_token(server: tuple[str, Path]) -> None:
    page = httpx.get(f"{server[0]}/console")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    script = httpx.get(f"{server[0]}/console/console.js").text
    assert "localStorage" not in script and "sessionStorage" not in script
    assert "document.cookie" not in script and "innerHTML" not in script
    missing = httpx.get(f"{server[0]}/console/../catalog.db")
    assert missing.status_code == 404
    assert httpx.get(f"{server[0]}/console/secrets.json").status_code == 404


def test_addresses_beside_the_page_lead_to_it_relatively(server: tuple[str, Path]) -> None:
    """`/console/` and `/console/index.html` would serve the page where its relative file
    paths do not resolve: they redirect to it instead, by a relative address, so that the
    redirect stays under a front proxy's path prefix (tests/test_console_sign_in.py)."""
    for beside in ("/console/", "/console/index.html"):
        answer = httpx.get(f"{server[0]}{beside}")
        assert answer.status_code == 308 and answer.headers["location"] == "../console"
        followed = httpx.get(f"{server[0]}{beside}", follow_redirects=True)
        assert followed.status_code == 200 and str(followed.url) == f"{server[0]}/console"


# -- a tenant with a directory matched on a claim of its own (Entra: oid) --------------------

# An admin of acme whose token carries the directory's user claim, as acme's tokens must.
DIRECTORY_ADMIN: dict[str, Any] = {
    "sub": "root",
    "groups": ["ops", "staff", "risk", "risk-team"],
    "oid": "oid-root",
}


@pytest.fixture(scope="module")
def directory_server(
    tmp_path_factory: pytest.TempPathFactory, jwks_file: Path, embedder: Embedder
) -> Iterator[str]:
    """acme under `directory: {user_claim: oid, user_attribute: externalId}`, with a SCIM
    directory: dora (in its group risk-team) and erin (deactivated). `otter` is read by
    risk-team; `zebra` has two versions in force at once, for staff and for risk."""
    docs = tmp_path_factory.mktemp("console-directory-docs")
    meta = {"tenant": "acme", "region": "EU", "effective_from": "2020-01-01"}
    text = "The zebra crossing allowance is ZCA-{} metres."
    for name, fields, body in (
        ("otter.md", {"doc_id": "otter", "acl": ["group:risk-team"]}, "The otter pond is OPB-55."),
        (
            "zebra-1.md",
            {
                "doc_id": "zebra",
                "version": "1",
                "acl": ["group:staff"],
                "effective_to": "2099-12-31",
            },
            text.format(1),
        ),
        (
            "zebra-2.md",
            {
                "doc_id": "zebra",
                "version": "2",
                "acl": ["group:risk"],
                "effective_from": "2021-01-01",
            },
            text.format(2),
        ),
    ):
        write_doc(docs, name, {**meta, **fields}, body)
    data = tmp_path_factory.mktemp("console-directory-data")
    ingest_paths([docs], DataLayout(data), embedder)
    key = bearer(scim_key(DataLayout(data), "acme"))
    policy_dir = write_policy(tmp_path_factory.mktemp("console-directory-policy"))
    policy = yaml.safe_load((policy_dir / "policy.yaml").read_text())
    policy["directory"] = {"user_claim": "oid", "user_attribute": "externalId"}
    (policy_dir / "policy.yaml").write_text(yaml.safe_dump(policy))
    env = served_env(data, jwks_file, GATEWAY_POLICY_DIR=str(policy_dir))
    with running_server(env) as (base, _process):

        def scim(method: str, path: str, body: dict[str, Any]) -> str:
            made = httpx.request(method, f"{base}/scim/v2{path}", json=body, headers=key)
            assert made.status_code in (200, 201), made.text
            return str(made.json()["id"])

        dora = scim(
            "POST", "/Users", {"schemas": [USER], "userName": "dora", "externalId": "oid-dora"}
        )
        erin = scim(
            "POST", "/Users", {"schemas": [USER], "userName": "erin", "externalId": "oid-erin"}
        )
        members = [{"value": dora}]
        scim(
            "POST", "/Groups", {"schemas": [GROUP], "displayName": "risk-team", "members": members}
        )
        off = {"op": "replace", "value": {"active": False}}
        scim("PATCH", f"/Users/{erin}", {"schemas": [PATCH], "Operations": [off]})
        yield base


@pytest.fixture
def directory_page(browser: Any, directory_server: str) -> Iterator[Any]:
    with console_page(browser, directory_server) as opened:
        yield opened


def try_as(page: Any, claims: dict[str, Any], query: str, doc_id: str, shows: str) -> str:
    """The Try as row of `doc_id` once it shows `shows`: its text."""
    page.fill("#claims", json.dumps(claims))
    page.fill("#query", query)
    page.click("#try-form button[type=submit]")
    return str(
        page.wait_for_selector(f"#results tr[data-doc={doc_id}]:has-text('{shows}')").inner_text()
    )


def test_try_as_asks_for_the_directorys_user_claim_and_says_why_claims_are_refused(
    directory_page: Any, make_token: TokenFactory
) -> None:
    """The claims the page offered lacked `oid`, and a refused try read "the claims lack a
    usable subject, tenant or region": now the page offers the claim, empty (its value is
    the person's in the directory, which the page cannot guess), and says what explain
    says, as a token with those claims is told."""
    page = directory_page
    sign_in(page, make_token(**DIRECTORY_ADMIN))
    page.wait_for_selector("#app:not([hidden])")
    offered = json.loads(page.input_value("#claims"))
    assert offered == {"sub": "alice", "tenant": "acme", "region": "EU", "groups": [], "oid": ""}

    refused = try_as(page, {**offered, "sub": "dora"}, "otter pond", "otter", "hidden")
    reason = "this tenant has a directory: the token must carry its user claim (oid)"
    assert f"insufficient_claims: {reason}" in refused
    assert "subject, tenant or region" not in refused

    dora = {**offered, "sub": "dora", "oid": "oid-dora"}
    shown = try_as(page, dora, "otter pond", "otter", "visible")
    assert "acl: group:risk-team (directory)" in shown

    erin = {**offered, "sub": "erin", "oid": "oid-erin"}
    disabled = try_as(page, erin, "otter pond", "otter", "account_disabled")
    assert "account_disabled: this account is disabled in the directory" in disabled


def test_try_as_shows_why_of_the_version_explain_decided_on(
    directory_page: Any, make_token: TokenFactory
) -> None:
    """Two versions of zebra are in force: explain (and GET /documents) decide on the
    newest visible, 2, read by group:risk; the page showed why of the first visible one
    listed, 1, read by group:staff."""
    page = directory_page
    sign_in(page, make_token(**DIRECTORY_ADMIN))
    page.wait_for_selector("#app:not([hidden])")
    bo = {
        "sub": "bo",
        "tenant": "acme",
        "region": "EU",
        "groups": ["risk", "staff"],
        "oid": "oid-bo",
    }
    shown = try_as(page, bo, "zebra crossing allowance", "zebra", "visible")
    assert "acl: group:risk (groups)" in shown and "group:staff" not in shown
