"""The console in Chromium (Playwright) against a real `gateway serve`: what one admin's
session leaves for the next person at the same browser (nothing), the claim names of the
serving policy, tokens whose claims are not ASCII, and what the page says for a refused
token or an invalid request.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.helpers.browser import chromium, console_page
from tests.helpers.callers import ALICE, EVE
from tests.helpers.identity import AUDIENCE, ISSUER, TokenFactory
from tests.helpers.policies import write_policy
from tests.helpers.processes import gateway_env, running_server

pytestmark = pytest.mark.server

# An admin of acme (ops is nested in gateway-admins) who also sees the merchant-risk documents.
ADMIN: dict[str, Any] = {"sub": "root", "groups": ["ops", "staff", "merchant-risk"]}
# The claim names of a policy mapped to another identity provider's (docs/policy.md, "`claims`").
MAPPED = {"subject": "oid", "tenant": "tid", "region": "loc", "groups": "grp"}


def serve(data_dir: Path, jwks_file: Path, policy_dir: Path) -> Any:
    env = gateway_env(
        GATEWAY_DATA_DIR=str(data_dir),
        GATEWAY_POLICY_DIR=str(policy_dir),
        GATEWAY_OIDC_ISSUER=ISSUER,
        GATEWAY_OIDC_AUDIENCE=AUDIENCE,
        GATEWAY_JWKS_URI=jwks_file.as_uri(),
        GATEWAY_JWT_LEEWAY_S="0",  # so a token can expire while the page is open
    )
    return running_server(env)


@pytest.fixture(scope="module")
def server(
    data_dir: Path, jwks_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    with serve(data_dir, jwks_file, write_policy(tmp_path_factory.mktemp("policy"))) as (
        base,
        _process,
    ):
        yield base


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser: Any, server: str) -> Iterator[Any]:
    with console_page(browser, server) as opened:
        yield opened


def sign_in(page: Any, token: str) -> None:
    page.goto("/console")
    page.fill("#token", token)
    page.click("#sign-in-form button[type=submit]")


def paste(page: Any, token: str) -> None:
    """Sign in on the page as it is (no reload), as the next admin at that browser would."""
    page.fill("#token", token)
    page.click("#sign-in-form button[type=submit]")


def audited(base: str, token: str) -> None:
    """A request by that token, in the audit trail by the time the page asks for recent
    subjects (/readyz writes the records waiting)."""
    httpx.get(f"{base}/admin/index", headers={"Authorization": f"Bearer {token}"})
    httpx.get(f"{base}/readyz")


def everything_on(page: Any) -> str:
    """The page's markup and text, and the values typed into its fields (not in the markup)."""
    return str(
        page.evaluate(
            """() => [document.documentElement.outerHTML, document.body.innerText,
                ...[...document.querySelectorAll("input, textarea, select")].map((f) => f.value),
            ].join("\\n")"""
        )
    )


def test_the_next_admin_at_the_browser_sees_nothing_of_the_last_ones_session(
    page: Any, server: str, make_token: TokenFactory
) -> None:
    audited(server, make_token(**ADMIN))
    audited(server, make_token(**EVE))
    sign_in(page, make_token(**ADMIN))
    page.wait_for_selector("#app:not([hidden])")
    query = "merchant fraud chargeback thresholds"
    claims = {"sub": "alice-in-acme", "tenant": "acme", "region": "EU", "groups": ["staff"]}
    page.fill("#claims", json.dumps(claims))
    page.fill("#query", query)
    page.click("#try-form button[type=submit]")
    page.wait_for_selector("#results tr[data-doc=merchant-fraud]")
    # The audit trail's subjects, in a <select> (options are never "visible").
    page.wait_for_selector("#recent option[value=root]", state="attached")
    page.click(".tab[data-panel=policy]")
    edited = yaml.safe_dump({"nested_groups": {"acme-secret-team": ["gateway-admins"]}})
    page.fill("#files .file-text", edited)
    page.click("#preview")
    page.wait_for_selector("#preview-out p")
    page.click(".tab[data-panel=index]")
    page.wait_for_selector("#index-state dd")
    seen = everything_on(page)
    left = [query, "alice-in-acme", "Merchant fraud thresholds", "merchant-fraud"]
    left += ["acme-secret-team", "root · tenant acme", 'value="root"']
    assert all(text in seen for text in left)  # what must go at sign-out

    page.click("#sign-out")
    page.wait_for_selector("#sign-in-error:has-text('Signed out')")
    assert not [text for text in left if text in everything_on(page)]

    # An admin of globex signs in at the same page.
    paste(page, make_token(**EVE))
    page.wait_for_selector("#who:has-text('eve · tenant globex')")
    # Its start-up calls have answered (the policy page is not shown, so: attached).
    page.wait_for_selector("#policy-note:not(:empty)", state="attached")
    page.wait_for_selector("#recent option[value=eve]", state="attached")
    assert not [text for text in left if text in everything_on(page)]
    assert page.locator("#results").is_hidden() and page.locator("#timings .bar").count() == 0
    assert page.input_value("#files .file-text") == ""


def test_a_refused_token_leaves_the_token_box_and_the_page_empty(
    page: Any, make_token: TokenFactory
) -> None:
    sign_in(page, make_token(**ALICE))
    page.wait_for_selector("#sign-in-error:has-text('Not an admin')")
    assert page.input_value("#token") == ""

    # A token that expires while the page is open: the call after its exp gets 401 (the
    # server allows no leeway here), and the page signs itself out.
    expires = time.time() + 15  # long enough to sign in and search on a loaded machine
    paste(page, make_token(**ADMIN, ttl=15))
    page.wait_for_selector("#app:not([hidden])")
    page.fill("#query", "refund policy receipt")
    page.click("#try-form button[type=submit]")
    page.wait_for_selector("#results tr[data-doc=refund-policy]")
    assert "Refund policy" in everything_on(page)
    page.wait_for_timeout(max(0.0, expires - time.time() + 1) * 1000)
    page.click("#try-form button[type=submit]")
    page.wait_for_selector("#sign-in-error:has-text('Paste a new one')")
    shown = everything_on(page)
    assert "Refund policy" not in shown and "refund policy receipt" not in shown
    assert "root · tenant acme" not in shown


def test_the_page_reads_and_writes_the_claims_the_serving_policy_names(
    browser: Any,
    data_dir: Path,
    jwks_file: Path,
    signing_key: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Under `claims: {subject: oid, tenant: tid, ...}` the header names the admin, the claims
    to try are prefilled under those names, and a recent subject is written as `oid`: the
    documents of the admin's own tenant are explained by their ACL, not as claims missing."""

    def token(**claims: Any) -> str:
        now = int(time.time())
        return str(
            signing_key.sign(
                {"iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 600, **claims}
            )
        )

    policy_dir = write_policy(tmp_path_factory.mktemp("mapped"), claims=MAPPED)
    admin = token(oid="zoe", tid="acme", loc="EU", grp=["ops", "staff"], sub="x-123")
    with (
        serve(data_dir, jwks_file, policy_dir) as (base, _process),
        console_page(browser, base) as page,
    ):
        audited(base, admin)
        sign_in(page, admin)
        page.wait_for_selector("#app:not([hidden])")
        assert page.inner_text("#who") == "zoe · tenant acme"
        prefilled = json.loads(page.input_value("#claims"))
        assert prefilled == {"oid": "alice", "tid": "acme", "loc": "EU", "grp": []}

        page.wait_for_selector("#recent option[value=zoe]", state="attached")
        page.select_option("#recent", "zoe")
        picked = json.loads(page.input_value("#claims"))
        assert picked["oid"] == "zoe" and "sub" not in picked
        page.fill("#claims", json.dumps({**picked, "grp": ["staff"]}))
        page.fill("#query", "refund policy receipt")
        page.click("#try-form button[type=submit]")
        verdict = page.wait_for_selector("#results tr[data-doc=refund-policy]").inner_text()
        assert "visible" in verdict and "insufficient_claims" not in verdict


def test_claims_that_are_not_ascii_are_shown_and_prefilled_as_written(
    page: Any, make_token: TokenFactory
) -> None:
    sign_in(page, make_token(sub="zoë", tenant="café-ü", groups=["ops"]))
    page.wait_for_selector("#app:not([hidden])")
    assert page.inner_text("#who") == "zoë · tenant café-ü"
    assert json.loads(page.input_value("#claims"))["tenant"] == "café-ü"


def test_a_token_refused_for_its_claims_is_told_why_not_not_an_admin(
    page: Any, make_token: TokenFactory
) -> None:
    sign_in(page, make_token(**ADMIN, region=None))  # an admin's token, without a region
    error = page.wait_for_selector("#sign-in-error:not(:empty)").inner_text()
    assert "Not an admin" not in error
    assert "insufficient_claims" in error and "region" in error
    assert page.locator("#app").is_hidden()


def test_an_invalid_request_names_the_field_at_fault(page: Any, make_token: TokenFactory) -> None:
    sign_in(page, make_token(**ADMIN))
    page.wait_for_selector("#app:not([hidden])")
    page.fill("#query", "refund " * 400)  # over the 2000 characters a query may have
    page.click("#try-form button[type=submit]")
    error = page.wait_for_selector("#try-error:not(:empty)").inner_text()
    assert "body.query: String should have at most 2000 characters" in error

    for not_an_object in ("[]", "null", '"alice"'):
        page.fill("#claims", not_an_object)
        page.fill("#query", "refund policy")
        page.click("#try-form button[type=submit]")
        page.wait_for_selector("#try-error:has-text('must be a JSON object')")
        assert page.locator("#results").is_hidden()
