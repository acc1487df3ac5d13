"""Where keys come from: https or file only, kept fresh, and the dev issuer kept in its box."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.authn.devissuer import DEV_ISSUER, resolve_identity
from gateway.authn.devkeys import SigningKey, generate_signing_key, write_jwks
from gateway.authn.tokens import TokenVerifier
from gateway.errors import GatewayError
from gateway.settings import Settings
from tests.helpers.identity import AUDIENCE, ISSUER, claims
from tests.helpers.issuers import FakeClock, FakeIssuer, run, verifier_settings
from tests.helpers.processes import gateway_env, run_gateway


@pytest.fixture(scope="module")
def rsa_key() -> SigningKey:
    return generate_signing_key("RS256", kid="rsa-1")


@pytest.mark.parametrize(
    "settings",
    [
        {"jwks_uri": "http://issuer.test/keys"},
        {"jwks_uri": "ftp://issuer.test/keys"},
        {"oidc_issuer": "http://issuer.test"},  # discovery would fetch over plain http
    ],
)
def test_keys_over_plain_http_are_a_startup_error(settings: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="https"):
        Settings(**{"oidc_issuer": ISSUER, "oidc_audience": AUDIENCE, **settings})


def test_https_and_file_keys_are_accepted(tmp_path: Path) -> None:
    Settings(oidc_issuer=ISSUER, oidc_audience=AUDIENCE, jwks_uri="https://issuer.test/keys")
    Settings(oidc_issuer="http://local", oidc_audience=AUDIENCE, jwks_uri=tmp_path.as_uri())
    Settings(oidc_issuer=ISSUER, oidc_audience=AUDIENCE)  # discovery over https


def test_a_discovered_plain_http_jwks_uri_is_refused(rsa_key: SigningKey) -> None:
    issuer = FakeIssuer(rsa_key.public_jwks())
    issuer.jwks_uri = "http://issuer.test/keys"

    async def go() -> None:
        verifier = TokenVerifier(verifier_settings(), issuer.transport)
        try:
            with pytest.raises(GatewayError) as refused:
                await verifier.verify(rsa_key.sign(claims()))
            assert refused.value.code == "unauthenticated"
        finally:
            await verifier.aclose()

    run(go())
    assert issuer.jwks_fetches == 0  # the keys were never fetched over plain http


def test_a_key_the_issuer_removed_stops_working_within_one_refresh_interval(
    tmp_path: Path, rsa_key: SigningKey
) -> None:
    path = tmp_path / "jwks.json"
    write_jwks(path, rsa_key.public_jwks())
    successor = generate_signing_key("RS256", kid="rsa-2")
    clock = FakeClock()
    settings = verifier_settings(path.as_uri(), jwks_refresh_interval_s=300)

    async def go() -> None:
        verifier = TokenVerifier(settings, clock=clock)
        try:
            await verifier.verify(rsa_key.sign(claims()))
            write_jwks(path, successor.public_jwks())  # the issuer drops the old key
            clock.now += 100
            await verifier.verify(rsa_key.sign(claims()))  # still inside the interval
            clock.now += 201
            await verifier.verify(rsa_key.sign(claims()))  # notices: refetch, no wait
            for _ in range(1000):  # let the background fetch finish (a file read, in a thread)
                if verifier.fetches["ok"] == 2:
                    break
                await asyncio.sleep(0.01)
            with pytest.raises(GatewayError):
                await verifier.verify(rsa_key.sign(claims()))
            await verifier.verify(successor.sign(claims()))
        finally:
            await verifier.aclose()

    run(go())


def test_the_dev_issuer_is_refused_beside_a_configured_identity_provider(
    tmp_path: Path,
) -> None:
    alone = resolve_identity(Settings(data_dir=tmp_path, dev_issuer=True))
    assert alone.oidc_issuer == DEV_ISSUER and alone.jwks_uri.startswith("file://")
    configured = Settings(
        data_dir=tmp_path, dev_issuer=True, oidc_issuer=ISSUER, oidc_audience=AUDIENCE
    )
    with pytest.raises(GatewayError, match="GATEWAY_OIDC_ISSUER"):
        resolve_identity(configured)  # before: the real issuer was checked with dev keys


@pytest.mark.server
def test_serve_refuses_the_dev_issuer_off_loopback(tmp_path: Path) -> None:
    env = gateway_env(GATEWAY_DATA_DIR=str(tmp_path), GATEWAY_DEV_ISSUER="true")
    result = run_gateway("serve", "--host", "0.0.0.0", "--port", "1", env=env)
    assert result.returncode == 1 and "loopback" in result.stderr


@pytest.mark.parametrize(
    "identity",
    [
        {},
        {"oidc_issuer": "http://login.example", "jwks_uri": "https://login.example/keys"},
    ],
)
def test_console_sign_in_needs_an_https_issuer(identity: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="GATEWAY_CONSOLE_CLIENT_ID"):
        Settings(console_client_id="gateway-console", **identity)
    Settings(console_client_id="gateway-console", oidc_issuer="https://login.example")


def test_the_consoles_client_id_cannot_be_the_apis_audience() -> None:
    """The console's ID tokens name its client as their audience: they would be bearers."""
    issuer = {"oidc_issuer": "https://login.example"}
    with pytest.raises(ValidationError, match="must differ from GATEWAY_OIDC_AUDIENCE"):
        Settings(console_client_id="6f1c-app", oidc_audience="6f1c-app", **issuer)
    Settings(console_client_id="6f1c-app", oidc_audience="api://6f1c-api", **issuer)


@pytest.mark.server
def test_serve_says_which_settings_clash(tmp_path: Path) -> None:
    env = gateway_env(
        GATEWAY_DATA_DIR=str(tmp_path),
        GATEWAY_OIDC_ISSUER="https://login.example",
        GATEWAY_OIDC_AUDIENCE="6f1c-app",
        GATEWAY_CONSOLE_CLIENT_ID="6f1c-app",
    )
    result = run_gateway("serve", "--port", "1", env=env)
    assert result.returncode == 1
    assert "invalid settings: GATEWAY_CONSOLE_CLIENT_ID must differ from GATEWAY_OIDC_AUDIENCE" in (
        result.stderr
    )


def test_an_issuer_ca_file_that_is_not_there_is_a_startup_error(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="no such file"):
        Settings(oidc_ca_file=tmp_path / "missing.pem")
    (tmp_path / "empty.pem").write_text("")
    with pytest.raises(ssl.SSLError):  # a file with no certificate in it
        TokenVerifier(verifier_settings(oidc_ca_file=tmp_path / "empty.pem"))
