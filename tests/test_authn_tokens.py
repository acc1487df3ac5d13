"""TokenVerifier against real keys and real signatures; only the issuer's network is faked."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.authn.devkeys import SigningKey, generate_signing_key, jwks_of, write_jwks
from gateway.authn.tokens import GENERIC_DETAIL, MAX_TOKEN_CHARS, TokenVerifier
from gateway.errors import GatewayError
from gateway.settings import Settings
from tests.helpers.identity import (
    AUDIENCE,
    EXPECTED_REASON,
    ISSUER,
    LEEWAY,
    claims,
    forged_tokens,
    raw_rs256,
)
from tests.helpers.issuers import (
    DISCOVERY_PATH,
    JWKS_PATH,
    FakeClock,
    FakeIssuer,
    run,
    verifier_settings,
)


def verify_all(
    settings: Settings,
    tokens: list[str],
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[dict[str, Any] | GatewayError]:
    """Each token through one verifier, in order; errors are returned, not raised."""

    async def go() -> list[dict[str, Any] | GatewayError]:
        verifier = TokenVerifier(settings, transport=transport)
        results: list[dict[str, Any] | GatewayError] = []
        try:
            for token in tokens:
                try:
                    results.append(await verifier.verify(token))
                except GatewayError as exc:
                    results.append(exc)
        finally:
            await verifier.aclose()
        return results

    return run(go())


def verify_one(
    settings: Settings, token: str, transport: httpx.AsyncBaseTransport | None = None
) -> dict[str, Any] | GatewayError:
    return verify_all(settings, [token], transport)[0]


def assert_rejected(result: dict[str, Any] | GatewayError) -> GatewayError:
    assert isinstance(result, GatewayError), f"accepted: {result}"
    assert result.code == "unauthenticated"
    assert result.status == 401
    assert result.detail == GENERIC_DETAIL
    return result


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def rsa_key() -> SigningKey:
    return generate_signing_key("RS256", kid="rsa-1")


@pytest.fixture(scope="module")
def ec_key() -> SigningKey:
    return generate_signing_key("ES256", kid="ec-1")


@pytest.fixture(scope="module")
def jwks_file(
    tmp_path_factory: pytest.TempPathFactory, rsa_key: SigningKey, ec_key: SigningKey
) -> Path:
    path = tmp_path_factory.mktemp("issuer") / "jwks.json"
    write_jwks(path, jwks_of(rsa_key, ec_key))
    return path


@pytest.fixture(scope="module")
def file_settings(jwks_file: Path) -> Settings:
    return verifier_settings(jwks_file.as_uri())


# ---------------------------------------------------------------------------- accepted


@pytest.mark.parametrize("alg", ["RS256", "ES256"])
def test_valid_token_returns_claims(
    alg: str, rsa_key: SigningKey, ec_key: SigningKey, file_settings: Settings
) -> None:
    key = rsa_key if alg == "RS256" else ec_key
    expected = claims(groups=["staff"], tenant="acme", region="EU")
    result = verify_one(file_settings, key.sign(expected))
    assert result == expected


def test_devkeys_generates_real_distinct_keys() -> None:
    first, second = generate_signing_key("ES256"), generate_signing_key("ES256")
    assert first.kid != second.kid  # thumbprint kids
    jwk = first.public_jwk()
    assert jwk["kty"] == "EC" and jwk["alg"] == "ES256" and "d" not in jwk
    with pytest.raises(ValueError):
        generate_signing_key("HS256")


def test_audience_list_containing_ours_is_accepted(
    rsa_key: SigningKey, file_settings: Settings
) -> None:
    token = rsa_key.sign(claims(aud=["other-api", AUDIENCE]))
    assert not isinstance(verify_one(file_settings, token), GatewayError)


def test_expired_within_leeway_is_accepted(rsa_key: SigningKey, file_settings: Settings) -> None:
    now = int(time.time())
    token = rsa_key.sign(claims(iat=now - 600, nbf=now - 600, exp=now - LEEWAY // 3))
    assert not isinstance(verify_one(file_settings, token), GatewayError)


def test_nbf_within_leeway_is_accepted(rsa_key: SigningKey, file_settings: Settings) -> None:
    token = rsa_key.sign(claims(nbf=int(time.time()) + LEEWAY // 3))
    assert not isinstance(verify_one(file_settings, token), GatewayError)


def test_single_key_jwks_accepts_token_without_kid(tmp_path: Path, rsa_key: SigningKey) -> None:
    path = tmp_path / "jwks.json"
    write_jwks(path, rsa_key.public_jwks())
    token = rsa_key.sign(claims(), headers={"kid": None})
    assert "kid" not in json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    assert not isinstance(verify_one(verifier_settings(path.as_uri()), token), GatewayError)


def test_independently_signed_token_with_extra_header_is_accepted(
    rsa_key: SigningKey, file_settings: Settings
) -> None:
    # RFC 7515 s4: a non-critical header parameter we do not know is ignored, not fatal.
    header = {"alg": "RS256", "typ": "at+jwt", "kid": rsa_key.kid, "x-tenant-hint": "acme"}
    token = raw_rs256(rsa_key, header, json.dumps(claims()).encode())
    assert not isinstance(verify_one(file_settings, token), GatewayError)


def test_token_just_under_size_limit_is_accepted(
    rsa_key: SigningKey, file_settings: Settings
) -> None:
    token = rsa_key.sign(claims(pad="x" * (MAX_TOKEN_CHARS * 3 // 4 - 1000)))
    assert MAX_TOKEN_CHARS - 1000 < len(token) <= MAX_TOKEN_CHARS
    assert not isinstance(verify_one(file_settings, token), GatewayError)


# ---------------------------------------------------------------------------- key sources


def test_discovery_finds_the_jwks(rsa_key: SigningKey) -> None:
    issuer = FakeIssuer(rsa_key.public_jwks())
    result = verify_one(verifier_settings(), rsa_key.sign(claims()), issuer.transport)
    assert not isinstance(result, GatewayError)
    assert issuer.paths == [DISCOVERY_PATH, JWKS_PATH]


def test_discovery_with_trailing_slash_issuer(rsa_key: SigningKey) -> None:
    issuer = FakeIssuer(rsa_key.public_jwks())
    settings = verifier_settings(oidc_issuer=ISSUER + "/")
    result = verify_one(settings, rsa_key.sign(claims(iss=ISSUER + "/")), issuer.transport)
    # The discovery document names "https://issuer.test", not the configured issuer: refused.
    assert_rejected(result)
    assert issuer.paths == [DISCOVERY_PATH]


def test_explicit_https_jwks_uri_skips_discovery(rsa_key: SigningKey) -> None:
    issuer = FakeIssuer(rsa_key.public_jwks())
    settings = verifier_settings(ISSUER + JWKS_PATH)
    tokens = [rsa_key.sign(claims()) for _ in range(3)]
    results = verify_all(settings, tokens, issuer.transport)
    assert not any(isinstance(result, GatewayError) for result in results)
    assert issuer.paths == [JWKS_PATH]  # fetched once, cached, discovery never asked


def test_explicit_file_jwks_uri_makes_no_request(
    rsa_key: SigningKey, file_settings: Settings
) -> None:
    issuer = FakeIssuer(rsa_key.public_jwks())
    result = verify_one(file_settings, rsa_key.sign(claims()), issuer.transport)
    assert not isinstance(result, GatewayError)
    assert issuer.paths == []


def assert_not_ready(result: dict[str, Any] | GatewayError) -> GatewayError:
    """The issuer's keys could not be loaded: a 503 to retry, not a token to throw away."""
    assert isinstance(result, GatewayError), f"accepted: {result}"
    assert (result.code, result.status) == ("not_ready", 503)
    assert result.headers is not None and int(result.headers["Retry-After"]) >= 1
    return result


@pytest.mark.parametrize("status", [404, 500, 503])
def test_unreachable_issuer_is_not_ready(status: int, rsa_key: SigningKey) -> None:
    issuer = FakeIssuer(rsa_key.public_jwks(), status=status)
    assert_not_ready(verify_one(verifier_settings(), rsa_key.sign(claims()), issuer.transport))


def test_connection_error_is_not_ready(rsa_key: SigningKey) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    transport = httpx.MockTransport(refuse)
    assert_not_ready(verify_one(verifier_settings(), rsa_key.sign(claims()), transport))


def test_missing_jwks_file_is_not_ready(tmp_path: Path, rsa_key: SigningKey) -> None:
    settings = verifier_settings((tmp_path / "absent.json").as_uri())
    assert_not_ready(verify_one(settings, rsa_key.sign(claims())))


def test_while_no_keys_can_be_loaded_tokens_wait_for_the_issuer(rsa_key: SigningKey) -> None:
    """Retry-After says when the issuer is asked again; once it answers, the same token
    passes. A token refused before any key is at hand is still a 401."""
    issuer = FakeIssuer(rsa_key.public_jwks(), status=503)
    clock = FakeClock()
    token = rsa_key.sign(claims())

    async def go() -> None:
        verifier = TokenVerifier(
            verifier_settings(ISSUER + JWKS_PATH), issuer.transport, clock=clock
        )
        try:
            with pytest.raises(GatewayError) as first:
                await verifier.verify(token)
            assert assert_not_ready(first.value).headers == {"Retry-After": "30"}
            clock.now += 12.5
            with pytest.raises(GatewayError) as again:
                await verifier.verify(token)
            assert assert_not_ready(again.value).headers == {"Retry-After": "18"}
            with pytest.raises(GatewayError) as garbage:
                await verifier.verify("not-a-token")
            assert_rejected(garbage.value)
            assert issuer.jwks_fetches == 1  # asked once per interval, outage or not
            issuer.status = 200
            clock.now += 18
            assert (await verifier.verify(token))["sub"] == "alice-7f3a"
        finally:
            await verifier.aclose()

    run(go())


def test_unconfigured_issuer_fails_closed(rsa_key: SigningKey, jwks_file: Path) -> None:
    token = rsa_key.sign(claims(iss="", aud=""))
    assert_rejected(verify_one(verifier_settings(jwks_file.as_uri(), oidc_issuer=""), token))
    assert_rejected(verify_one(verifier_settings(jwks_file.as_uri(), oidc_audience=""), token))


# ---------------------------------------------------------------------------- rejected


@pytest.fixture(scope="module")
def forged(rsa_key: SigningKey, ec_key: SigningKey) -> dict[str, str]:
    return forged_tokens(rsa_key, ec_key)


def test_every_forgery_has_an_expected_reason(forged: dict[str, str]) -> None:
    assert sorted(forged) == sorted(EXPECTED_REASON)


@pytest.mark.parametrize("name", sorted(EXPECTED_REASON))
def test_forged_token_is_rejected(
    name: str, forged: dict[str, str], file_settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="gateway.authn"):
        assert_rejected(verify_one(file_settings, forged[name]))
    assert [EXPECTED_REASON[name] in record.getMessage() for record in caplog.records] == [True]


def test_non_string_token_is_rejected(file_settings: Settings) -> None:
    assert_rejected(verify_one(file_settings, None))  # type: ignore[arg-type]


def test_all_failures_look_identical(
    forged: dict[str, str], file_settings: Settings, rsa_key: SigningKey
) -> None:
    errors = verify_all(file_settings, list(forged.values()))
    untrusted = FakeIssuer(rsa_key.public_jwks())
    untrusted.jwks_uri = "http://issuer.test/keys"  # discovery names a plain-http JWKS
    errors.append(verify_one(verifier_settings(), rsa_key.sign(claims()), untrusted.transport))
    rendered = {json.dumps(assert_rejected(error).problem(), sort_keys=True) for error in errors}
    assert len(rendered) == 1
    assert {str(error) for error in errors} == {f"unauthenticated: {GENERIC_DETAIL}"}


def test_rejection_logs_reason_without_token_or_claims(
    caplog: pytest.LogCaptureFixture, rsa_key: SigningKey, file_settings: Settings
) -> None:
    secret_sub = "sub-" + secrets.token_hex(8)
    tokens = [
        rsa_key.sign(claims(sub=secret_sub, aud="aud-" + secrets.token_hex(8))),
        rsa_key.sign(claims(sub=secret_sub, exp=int(time.time()) - 3600)),
    ]
    with caplog.at_level(logging.INFO, logger="gateway.authn"):
        verify_all(file_settings, tokens)
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2
    assert "aud" in messages[0] and "exp" in messages[1]
    assert all("rsa-1" in message and "RS256" in message for message in messages)
    text = "\n".join(messages)
    assert secret_sub not in text and "aud-" not in text
    for token in tokens:
        assert not any(part in text for part in token.split("."))


def test_header_values_the_caller_chose_are_not_logged(
    caplog: pytest.LogCaptureFixture, rsa_key: SigningKey, file_settings: Settings
) -> None:
    """Only a kid of a key the gateway holds and an allowed alg are logged as sent: the
    header is the caller's, and anything could be written there."""
    chosen = "chosen-" + secrets.token_hex(8)
    payload = json.dumps(claims()).encode()
    tokens = [
        raw_rs256(rsa_key, {"alg": "RS256", "kid": chosen}, payload),
        raw_rs256(rsa_key, {"alg": chosen, "kid": rsa_key.kid}, payload),
        raw_rs256(rsa_key, {"alg": "HS256", "kid": [chosen]}, payload),
    ]
    with caplog.at_level(logging.INFO, logger="gateway.authn"):
        for result in verify_all(file_settings, tokens):
            assert_rejected(result)
    messages = [record.getMessage() for record in caplog.records]
    assert [m.split(": ", 1)[1] for m in messages] == [
        "no key for kid (kid=<unknown> alg='RS256')",
        "algorithm not allowed (kid='rsa-1' alg=<unknown>)",
        "algorithm not allowed (kid=<unknown> alg=<unknown>)",
    ]
    assert chosen not in "\n".join(messages)


# ---------------------------------------------------------------------------- rotation


def test_rotation_refetches_on_unknown_kid(rsa_key: SigningKey) -> None:
    new_key = generate_signing_key("ES256", kid="ec-2")
    issuer = FakeIssuer(rsa_key.public_jwks())
    clock = FakeClock()

    async def go() -> None:
        verifier = TokenVerifier(
            verifier_settings(ISSUER + JWKS_PATH), issuer.transport, clock=clock
        )
        try:
            await verifier.verify(rsa_key.sign(claims()))
            assert issuer.jwks_fetches == 1
            issuer.jwks = new_key.public_jwks()  # the issuer rotates; we do not restart
            clock.now += 31
            assert (await verifier.verify(new_key.sign(claims())))["sub"] == "alice-7f3a"
            assert issuer.jwks_fetches == 2
            # The retired key is gone, and asking again within the interval fetches nothing.
            with pytest.raises(GatewayError):
                await verifier.verify(rsa_key.sign(claims()))
            await verifier.verify(new_key.sign(claims()))
            assert issuer.jwks_fetches == 2
        finally:
            await verifier.aclose()

    run(go())


def test_rotation_of_jwks_file(tmp_path: Path, rsa_key: SigningKey) -> None:
    path = tmp_path / "jwks.json"
    write_jwks(path, rsa_key.public_jwks())
    new_key = generate_signing_key("RS256", kid="rsa-2")

    async def go() -> None:
        verifier = TokenVerifier(verifier_settings(path.as_uri(), jwks_refresh_min_interval_s=0))
        try:
            await verifier.verify(rsa_key.sign(claims()))
            write_jwks(path, jwks_of(rsa_key, new_key))  # overlap while rotating
            await verifier.verify(new_key.sign(claims()))
            await verifier.verify(rsa_key.sign(claims()))
        finally:
            await verifier.aclose()

    run(go())


def test_failed_refetch_keeps_known_keys(rsa_key: SigningKey) -> None:
    issuer = FakeIssuer(rsa_key.public_jwks())
    clock = FakeClock()
    stranger = generate_signing_key("RS256", kid="stranger")

    async def go() -> None:
        verifier = TokenVerifier(
            verifier_settings(ISSUER + JWKS_PATH), issuer.transport, clock=clock
        )
        try:
            await verifier.verify(rsa_key.sign(claims()))
            issuer.status = 503
            clock.now += 31
            with pytest.raises(GatewayError):
                await verifier.verify(stranger.sign(claims()))
            await verifier.verify(rsa_key.sign(claims()))  # still verifiable
            assert verifier.fetches == {"ok": 1, "failed": 1}  # gateway_jwks_fetches_total
        finally:
            await verifier.aclose()

    run(go())


# Keys of a JWKS the gateway cannot use; MATERIAL marks their members, which no log may show.
MATERIAL = "Zm9yZ2V0LW1lLW5vdA"
UNUSABLE_JWKS = {
    "rsa without e": {"kty": "RSA", "kid": "bad-rsa", "n": MATERIAL},
    "brainpool curve": {"kty": "EC", "kid": "bad-bp", "crv": "BP-256", "x": MATERIAL, "y": "AA"},
    "x5c only": {"kty": "RSA", "kid": "bad-x5c", "x5c": [MATERIAL]},
    "okp x448": {"kty": "OKP", "kid": "bad-okp", "crv": "X448", "x": MATERIAL},
}


@pytest.mark.parametrize("name", sorted(UNUSABLE_JWKS))
def test_an_unusable_jwk_is_skipped_not_fatal_to_the_set(
    name: str, rsa_key: SigningKey, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """RFC 7517 s5: the keys beside it still verify, from the first load on."""
    bad = UNUSABLE_JWKS[name]
    path = tmp_path / "jwks.json"
    write_jwks(path, {"keys": [bad, rsa_key.public_jwk()]})
    with caplog.at_level(logging.INFO, logger="gateway.authn"):
        result = verify_one(verifier_settings(path.as_uri()), rsa_key.sign(claims()))
    assert not isinstance(result, GatewayError)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert f"JWKS key skipped (kid={bad['kid']!r})" in logged
    assert MATERIAL not in logged


def test_rotation_to_a_set_with_an_unusable_key_drops_the_removed_key(
    rsa_key: SigningKey,
) -> None:
    successor = generate_signing_key("ES256", kid="ec-2")
    issuer = FakeIssuer(rsa_key.public_jwks())
    clock = FakeClock()

    async def go() -> None:
        verifier = TokenVerifier(
            verifier_settings(ISSUER + JWKS_PATH), issuer.transport, clock=clock
        )
        try:
            await verifier.verify(rsa_key.sign(claims()))
            issuer.jwks = {"keys": [successor.public_jwk(), UNUSABLE_JWKS["rsa without e"]]}
            clock.now += 31
            assert (await verifier.verify(successor.sign(claims())))["sub"] == "alice-7f3a"
            with pytest.raises(GatewayError):  # the issuer no longer publishes it
                await verifier.verify(rsa_key.sign(claims()))
            assert verifier.fetches == {"ok": 2}
        finally:
            await verifier.aclose()

    run(go())


@pytest.mark.parametrize("published", [[], [UNUSABLE_JWKS["brainpool curve"]]], ids=len)
def test_a_jwks_without_a_usable_key_refuses_every_token(
    published: list[dict[str, Any]], rsa_key: SigningKey
) -> None:
    """A well-formed set replaces the old one even when nothing in it is usable: the keys
    the issuer withdrew stop working. A 401, not a 503: the issuer answered."""
    stranger = generate_signing_key("RS256", kid="stranger")
    issuer = FakeIssuer(rsa_key.public_jwks())
    clock = FakeClock()

    async def go() -> None:
        verifier = TokenVerifier(
            verifier_settings(ISSUER + JWKS_PATH), issuer.transport, clock=clock
        )
        try:
            await verifier.verify(rsa_key.sign(claims()))
            issuer.jwks = {"keys": published}
            clock.now += 31
            for token in (stranger.sign(claims()), rsa_key.sign(claims())):
                with pytest.raises(GatewayError) as refused:
                    await verifier.verify(token)  # the first one sends for the new set
                assert_rejected(refused.value)
            assert verifier.fetches == {"ok": 2}
        finally:
            await verifier.aclose()

    run(go())


def test_a_first_jwks_without_a_usable_key_refuses_rather_than_waits(
    tmp_path: Path, rsa_key: SigningKey
) -> None:
    path = tmp_path / "jwks.json"
    write_jwks(path, {"keys": []})
    assert_rejected(verify_one(verifier_settings(path.as_uri()), rsa_key.sign(claims())))


@pytest.mark.parametrize("document", [{"keys": "none"}, {"keys": [1]}, {"jwks": []}, [1, 2]])
def test_a_document_that_is_not_a_jwks_keeps_the_known_keys(
    document: Any, rsa_key: SigningKey
) -> None:
    stranger = generate_signing_key("RS256", kid="stranger")
    issuer = FakeIssuer(rsa_key.public_jwks())
    clock = FakeClock()

    async def go() -> None:
        verifier = TokenVerifier(
            verifier_settings(ISSUER + JWKS_PATH), issuer.transport, clock=clock
        )
        try:
            await verifier.verify(rsa_key.sign(claims()))
            issuer.jwks = document
            clock.now += 31
            with pytest.raises(GatewayError):
                await verifier.verify(stranger.sign(claims()))  # sends for the set
            await verifier.verify(rsa_key.sign(claims()))  # a broken answer changes nothing
            assert verifier.fetches == {"ok": 1, "failed": 1}
        finally:
            await verifier.aclose()

    run(go())


def test_random_kid_flood_refetches_at_most_once_per_interval(rsa_key: SigningKey) -> None:
    issuer = FakeIssuer(rsa_key.public_jwks())
    clock = FakeClock()
    attacker = generate_signing_key("RS256", kid="attacker")

    def random_kid_tokens(count: int) -> list[str]:
        return [
            attacker.sign(claims(), headers={"kid": secrets.token_hex(8)}) for _ in range(count)
        ]

    async def attempt(verifier: TokenVerifier, token: str) -> bool:
        try:
            await verifier.verify(token)
        except GatewayError:
            return False
        return True

    async def go() -> None:
        verifier = TokenVerifier(
            verifier_settings(ISSUER + JWKS_PATH), issuer.transport, clock=clock
        )
        try:
            # Twenty concurrent first requests share one initial fetch.
            good = [rsa_key.sign(claims()) for _ in range(20)]
            assert all(await asyncio.gather(*(attempt(verifier, t) for t in good)))
            assert issuer.jwks_fetches == 1

            clock.now += 31  # a refetch is allowed again...
            flood = random_kid_tokens(20)
            accepted = await asyncio.gather(*(attempt(verifier, t) for t in flood))
            assert not any(accepted)
            assert issuer.jwks_fetches == 2  # ...and twenty unknown kids spend it once

            clock.now += 10  # still inside the interval
            for token in random_kid_tokens(20):
                assert not await attempt(verifier, token)
            assert issuer.jwks_fetches == 2

            clock.now += 30
            assert not await attempt(verifier, random_kid_tokens(1)[0])
            assert issuer.jwks_fetches == 3
            assert await attempt(verifier, rsa_key.sign(claims()))  # known kid: no fetch
            assert issuer.jwks_fetches == 3
        finally:
            await verifier.aclose()

    run(go())


# ------------------------------------------------------ signatures remembered per token


def test_a_remembered_token_is_refused_once_the_issuer_replaced_its_key(
    rsa_key: SigningKey,
) -> None:
    # The new key even reuses the kid: the token must be checked against it, not recalled.
    new_key = generate_signing_key("RS256", kid=rsa_key.kid)
    issuer = FakeIssuer(rsa_key.public_jwks())
    clock = FakeClock()
    token = rsa_key.sign(claims())

    async def go() -> None:
        verifier = TokenVerifier(
            verifier_settings(ISSUER + JWKS_PATH), issuer.transport, clock=clock
        )
        try:
            assert (await verifier.verify(token))["sub"] == "alice-7f3a"
            assert (await verifier.verify(token))["sub"] == "alice-7f3a"  # remembered
            issuer.jwks = new_key.public_jwks()  # the issuer replaces the key
            clock.now += verifier_settings().jwks_refresh_interval_s + 1
            await verifier.verify(token)  # the stale set answers, and sends for the new one
            await until_accepted(verifier, new_key.sign(claims()))
            with pytest.raises(GatewayError):
                await verifier.verify(token)  # the very same token, no longer signed for us
        finally:
            await verifier.aclose()

    run(go())


async def until_accepted(verifier: TokenVerifier, token: str) -> None:
    """Once the background JWKS fetch has landed (a few turns of the event loop)."""
    for _ in range(200):
        await asyncio.sleep(0.005)
        try:
            await verifier.verify(token)
            return
        except GatewayError:
            continue
    raise AssertionError("the new key set never arrived")


def test_a_remembered_token_still_expires(
    rsa_key: SigningKey, file_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = int(time.time())
    token = rsa_key.sign(claims(exp=now + 60))

    async def go() -> None:
        verifier = TokenVerifier(file_settings)
        try:
            assert (await verifier.verify(token))["sub"] == "alice-7f3a"
            # An hour later by joserfc's clock: past exp and the leeway.
            monkeypatch.setattr("joserfc._rfc7519.claims._generate_now", lambda: now + 3600)
            with pytest.raises(GatewayError):
                await verifier.verify(token)
        finally:
            await verifier.aclose()

    run(go())


def test_remembered_claims_cannot_be_changed_by_a_caller(
    rsa_key: SigningKey, file_settings: Settings
) -> None:
    token = rsa_key.sign(claims(groups=["staff"]))

    async def go() -> None:
        verifier = TokenVerifier(file_settings)
        try:
            first = await verifier.verify(token)
            first["groups"].append("admins")
            first["sub"] = "mallory"
            again = await verifier.verify(token)
            assert again["groups"] == ["staff"] and again["sub"] == "alice-7f3a"
        finally:
            await verifier.aclose()

    run(go())
