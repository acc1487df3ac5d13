"""The console signs in at a real OpenID provider (npm `oidc-provider` over TLS on loopback,
tests/helpers/idp.py): Chromium clicks "Sign in with your identity provider", the
provider's own login and consent pages open in a window, and the page gets an access
token by the authorization code flow with PKCE (S256) as a public client. The page then
works as that user (Try as runs the user's own search); the token is in the page's memory
only, and signing out forgets it and ends the provider's session. The CSP names the
issuer's origin and nothing wider.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.api.console import content_security_policy
from gateway.bench.server import free_port
from gateway.embedding import Embedder
from gateway.settings import Settings
from tests.helpers.browser import chromium, console_page, spki_hash
from tests.helpers.idp import CONSOLE_CLIENT_ID, Idp, running_idp
from tests.helpers.policies import write_policy
from tests.helpers.prefix_proxy import PrefixProxy, prefix_proxy
from tests.helpers.processes import gateway_env, running_server

pytestmark = pytest.mark.server

AUDIENCE = "https://gateway.test/api"  # what the provider puts in the console's tokens
PREFIX = "/rag"  # where a front proxy serves the gateway in the prefix's test


@pytest.fixture(scope="module")
def front() -> Iterator[PrefixProxy]:
    """A front proxy serving the gateway under PREFIX, bound before the provider is told
    its address."""
    with prefix_proxy(PREFIX) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def served(
    data_dir: Path, tmp_path_factory: pytest.TempPathFactory, front: PrefixProxy
) -> Iterator[tuple[str, Idp]]:
    port = free_port()
    # The console's client is registered for the gateway's own address and the proxy's.
    callbacks = f"http://127.0.0.1:{port}/console/callback {front.origin}{PREFIX}/console/callback"
    with running_idp(console_redirect_uris=callbacks, console_resource=AUDIENCE) as idp:
        env = gateway_env(
            GATEWAY_DATA_DIR=str(data_dir),
            GATEWAY_POLICY_DIR=str(write_policy(tmp_path_factory.mktemp("sso-policy"))),
            GATEWAY_OIDC_ISSUER=idp.issuer,
            GATEWAY_OIDC_AUDIENCE=AUDIENCE,
            GATEWAY_OIDC_CA_FILE=str(idp.ca_file),
            GATEWAY_CONSOLE_CLIENT_ID=CONSOLE_CLIENT_ID,
        )
        with running_server(env, port=port) as (base, _process):
            yield base, idp


@pytest.fixture(scope="module")
def browser(served: tuple[str, Idp]) -> Iterator[Any]:
    # The browser trusts the provider's one key, as a company's machines trust its CA.
    with chromium(f"--ignore-certificate-errors-spki-list={spki_hash(served[1].certificate)}") as b:
        yield b


@pytest.fixture
def page(browser: Any, served: tuple[str, Idp]) -> Iterator[Any]:
    with console_page(browser, served[0]) as opened:
        yield opened


def sign_in_at_the_provider(page: Any, user: str, at: str = "/console") -> None:
    page.goto(at)
    page.wait_for_selector("#idp:not([hidden])")
    with page.expect_popup() as opened:
        page.click("#idp-sign-in")
    popup = opened.value
    popup.wait_for_selector("input[name=login]")
    popup.fill("input[name=login]", user)
    popup.fill("input[name=password]", "any")
    popup.click("button[type=submit]")
    popup.wait_for_selector("input[name=prompt][value=consent]", state="attached")
    # Listening before the click: the popup may close before a later wait could start.
    with popup.expect_event("close"):
        popup.click("button[type=submit]")  # the consent page's Continue


def searches_sent(page: Any) -> list[str]:
    """The Authorization header of every search the page sends from now on."""
    sent: list[str] = []
    page.on(
        "request",
        lambda r: sent.append(r.headers.get("authorization", "")) if "/search" in r.url else None,
    )
    return sent


def test_an_admin_signs_in_at_the_provider_and_searches_as_themselves(page: Any) -> None:
    sent = searches_sent(page)
    answers: list[Any] = []
    page.on("response", lambda r: answers.append(r) if r.url.endswith("/token") else None)
    sign_in_at_the_provider(page, "root")
    page.wait_for_selector("#app:not([hidden])")
    assert "root · tenant acme" in page.inner_text("#who")

    # Try as searches with the admin's own token: root holds merchant-risk, so sees this one.
    page.fill("#query", "merchant fraud chargeback thresholds")
    page.click("#try-form button[type=submit]")
    page.wait_for_selector("#results tr[data-doc=merchant-fraud]")
    token = sent[-1].removeprefix("Bearer ")
    assert token.count(".") == 2  # the provider's JWT access token

    # In memory only: nothing in the page's storage, and no cookie holds it (cookies do not
    # tell ports apart: the provider's own session cookie on 127.0.0.1 is listed too).
    # The ID token too, kept to end the provider's session on sign-out.
    (answer,) = answers
    id_token = answer.json()["id_token"]
    stored = page.evaluate("() => [localStorage.length, sessionStorage.length, document.cookie]")
    assert stored[:2] == [0, 0] and token not in stored[2] and id_token not in stored[2]
    cookies = [c["value"] for c in page.context.cookies()]
    assert all(token not in c and id_token not in c for c in cookies)


def test_signing_out_ends_the_providers_session_so_the_next_sign_in_asks_again(
    page: Any,
) -> None:
    """On a shared machine the next person's "Sign in" must meet the provider's login
    page, not be let through as the last admin by the provider's session."""
    sign_in_at_the_provider(page, "root")
    page.wait_for_selector("#app:not([hidden])")
    page.click("#sign-out")
    ends_the_providers_session(page)


def ends_the_providers_session(page: Any, at: str = "/console") -> None:
    """Confirm at the provider, come back (to the page at `at`) signed out, and find that
    the next sign-in asks for a password."""
    page.click("button[name=logout][value=yes]")  # the provider's own page asks to confirm
    page.wait_for_url(re.compile(rf"^http://127\.0\.0\.1:\d+{re.escape(at)}$"))  # and back
    page.wait_for_selector("#idp:not([hidden])")
    assert page.locator("#app").is_hidden() and page.locator("#idp-sign-out").is_hidden()
    with page.expect_popup() as opened:
        page.click("#idp-sign-in")
    opened.value.wait_for_selector("input[name=login]")


def test_a_refused_token_leaves_the_providers_session_to_be_ended(page: Any) -> None:
    """The page's sign-out on a 401 (an expired token) cannot be the provider's: the page
    offers that sign-out instead of leaving the session to the next person."""
    sign_in_at_the_provider(page, "root")
    page.wait_for_selector("#app:not([hidden])")
    refused = {"type": "about:blank", "title": "Authentication required", "status": 401}
    page.route("**/search", lambda route: route.fulfill(status=401, json=refused))
    page.fill("#query", "merchant fraud chargeback thresholds")
    page.click("#try-form button[type=submit]")
    page.wait_for_selector("#sign-in-error:has-text('refused')")
    page.click("#idp-sign-out")
    ends_the_providers_session(page)


def test_without_a_sign_out_at_the_provider_the_page_says_its_session_goes_on(
    page: Any, served: tuple[str, Idp]
) -> None:
    """Signing out then stays in the page: it forgets the token, and says that the
    provider's session was not ended."""
    _, idp = served
    discovery = f"{idp.issuer}/.well-known/openid-configuration"
    with idp.client() as client:
        document = client.get(discovery).json()
    assert document.pop("end_session_endpoint")
    page.route(
        discovery,
        lambda route: route.fulfill(json=document, headers={"Access-Control-Allow-Origin": "*"}),
    )
    sent = searches_sent(page)
    sign_in_at_the_provider(page, "root")
    page.wait_for_selector("#app:not([hidden])")
    page.fill("#query", "merchant fraud chargeback thresholds")
    page.click("#try-form button[type=submit]")
    page.wait_for_selector("#results tr[data-doc=merchant-fraud]")
    token = sent[-1].removeprefix("Bearer ")

    page.click("#sign-out")
    page.wait_for_selector("#sign-in-error:has-text('its session goes on')")
    assert page.url.endswith("/console") and page.locator("#app").is_hidden()
    # Nothing of the session is left, and the form, filled and submitted again, carries
    # no token: it is gone, not just hidden.
    assert "merchant-fraud" not in page.content()
    page.evaluate(
        """() => {
            document.getElementById('claims').value = '{}';
            document.getElementById('query').value = 'merchant fraud chargeback thresholds';
            document.getElementById('try-form').requestSubmit();
        }"""
    )
    page.wait_for_selector("#sign-in-error:has-text('refused')")
    assert sent[-1] != f"Bearer {token}" and token not in sent[-1]


def test_a_user_who_is_not_an_admin_is_told_so_and_may_sign_out_at_the_provider(
    page: Any,
) -> None:
    """Else every "Sign in" would come back as the same account, with no way to switch."""
    sign_in_at_the_provider(page, "alice")
    page.wait_for_selector("#sign-in-error:has-text('Not an admin')")
    assert page.locator("#app").is_hidden()
    page.click("#idp-sign-out")
    ends_the_providers_session(page)


def test_pasting_a_token_still_works(page: Any, served: tuple[str, Idp]) -> None:
    base, idp = served
    # A service token for the gateway's audience, from the same provider (client credentials).
    token = idp.service_token(AUDIENCE)
    page.goto("/console")
    page.fill("#token", token)
    page.click("#sign-in-form button[type=submit]")
    page.wait_for_selector("#sign-in-error:has-text('Not an admin')")  # svc is not an admin
    assert page.locator("#idp-sign-out").is_hidden()  # no sign-in at the provider to end
    assert (
        httpx.get(f"{base}/admin/index", headers={"Authorization": f"Bearer {token}"}).status_code
        == 403
    )


def test_the_page_may_talk_to_the_issuers_origin_and_no_other(served: tuple[str, Idp]) -> None:
    base, idp = served
    policy = httpx.get(f"{base}/console").headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["connect-src"] == f"'self' {idp.issuer}"
    assert directives["form-action"] == "'none'" and directives["default-src"] == "'none'"
    assert "*" not in policy and "https:" not in policy.replace(idp.issuer, "")
    config = httpx.get(f"{base}/console/sign-in.json").json()
    assert config == {"issuer": idp.issuer, "client_id": CONSOLE_CLIENT_ID, "scope": "openid"}


def test_behind_a_path_prefix_the_console_signs_in_searches_and_signs_out(
    browser: Any, served: tuple[str, Idp], front: PrefixProxy
) -> None:
    """A front proxy serves the gateway under /rag: the page, its files, its calls, its
    redirect URI and its return address after signing out all stay under the prefix, and
    work there. The console needs no setting for it: it takes the prefix from where its
    page was served."""
    front.forward_to(served[0])
    origin = front.origin
    with console_page(browser, origin) as page:
        called: list[str] = []
        failed: list[str] = []
        page.on("request", lambda r: called.append(r.url))
        page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)
        # The address with a slash, as a proxy may spell it, comes back to the page's own.
        page.goto(f"{PREFIX}/console/")
        assert page.url == f"{origin}{PREFIX}/console"
        sign_in_at_the_provider(page, "root", at=f"{PREFIX}/console")
        page.wait_for_selector("#app:not([hidden])")
        assert "root · tenant acme" in page.inner_text("#who")
        page.fill("#query", "merchant fraud chargeback thresholds")
        page.click("#try-form button[type=submit]")
        page.wait_for_selector("#results tr[data-doc=merchant-fraud]")
        ours = {url for url in called if url.startswith(origin)}
        assert {
            f"{origin}{PREFIX}/console/console.js",
            f"{origin}{PREFIX}/console/console.css",
            f"{origin}{PREFIX}/console/sign-in.json",
            f"{origin}{PREFIX}/admin/index",
            f"{origin}{PREFIX}/search",
        } <= ours
        assert all(url.startswith(f"{origin}{PREFIX}/") for url in ours), ours
        assert failed == []

        page.click("#sign-out")
        ends_the_providers_session(page, at=f"{PREFIX}/console")


def test_the_page_may_also_reach_a_token_endpoint_on_another_origin(
    tmp_path: Path, jwks_file: Path, embedder: Embedder
) -> None:
    """Google's and Cognito's token endpoints are on other hosts than their issuers: the
    page's policy let it talk to the issuer's origin only, so the browser blocked the code
    exchange and the sign-in said the provider "cannot be reached". The issuer is faked at
    the HTTP transport, as the verifier's tests do."""
    issuer = "https://accounts.example"
    discovery = {"issuer": issuer, "token_endpoint": "https://oauth2.example/token"}
    asked: list[str] = []

    def provider(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        return httpx.Response(200, json=discovery)

    settings = Settings(
        data_dir=tmp_path / "data",
        oidc_issuer=issuer,
        oidc_audience="gateway",
        jwks_uri=jwks_file.as_uri(),
        console_client_id=CONSOLE_CLIENT_ID,
    )
    app = create_app(settings, embedder=embedder, transport=httpx.MockTransport(provider))
    with TestClient(app) as client:
        for _ in range(2):
            policy = client.get("/console").headers["content-security-policy"]
            directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
            assert directives["connect-src"] == f"'self' {issuer} https://oauth2.example"
    assert asked == [f"{issuer}/.well-known/openid-configuration"]  # looked up once


def test_the_token_endpoint_widens_nothing_without_sign_in() -> None:
    with_sign_in = Settings(
        oidc_issuer="https://accounts.example",
        oidc_audience="gateway",
        console_client_id=CONSOLE_CLIENT_ID,
    )
    connect = "connect-src 'self' https://accounts.example;"
    assert connect in content_security_policy(with_sign_in, "https://accounts.example")
    pasting_only = with_sign_in.model_copy(update={"console_client_id": ""})
    assert "connect-src 'self';" in content_security_policy(pasting_only, "https://oauth2.example")
