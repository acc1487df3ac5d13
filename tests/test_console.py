"""The admins' console at /console, in a real browser: Playwright driving Debian's Chromium
against a real `gateway serve` process. Sign in, Try as (results, the rule that hides a
document, stage timings), an impact preview of a widening edit, the index page; a
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

from tests.helpers.browser import chromium, console_page
from tests.helpers.callers import ALICE
from tests.helpers.identity import AUDIENCE, ISSUER, TokenFactory
from tests.helpers.policies import write_policy
from tests.helpers.processes import gateway_env, running_server

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
