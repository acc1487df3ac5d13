"""Every token attack of the security issue, through the real app: each is the same 401."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.authn.devkeys import SigningKey, generate_signing_key, jwks_of, write_jwks
from gateway.embedding import Embedder
from tests.helpers.identity import (
    EXPECTED_REASON,
    TokenFactory,
    bearer,
    forged_tokens,
    make_settings,
)

ROUTES = (
    ("POST", "/search", {"query": "RPL-14"}),
    ("POST", "/answer", {"query": "RPL-14"}),
    ("GET", "/documents/refund-policy", None),
    ("GET", "/chunks/refund-policy%402%3A0", None),
    ("GET", "/admin/policy", None),
)


@pytest.fixture(scope="module")
def attacked(
    tmp_path_factory: pytest.TempPathFactory,
    data_dir: Path,
    signing_key: SigningKey,
    embedder: Embedder,
) -> Iterator[tuple[TestClient, dict[str, str]]]:
    # Two keys published, as during a rotation, so a token without `kid` is ambiguous.
    other = generate_signing_key("ES256", kid="test-key-2")
    jwks = tmp_path_factory.mktemp("attack-issuer") / "jwks.json"
    write_jwks(jwks, jwks_of(signing_key, other))
    tokens = forged_tokens(signing_key, other)
    with TestClient(create_app(make_settings(data_dir, jwks), embedder=embedder)) as client:
        yield client, tokens


# "Bearer  <token>": HTTP parsing drops the extra space and the signed token is genuine;
# the verifier refuses the padded string itself (tests/test_authn_tokens.py).
ATTACKS = sorted(set(EXPECTED_REASON) - {"whitespace"})


def test_every_attack_is_listed() -> None:
    assert len(ATTACKS) >= 40


@pytest.mark.parametrize("name", ATTACKS)
def test_attack_is_401_and_indistinguishable(
    attacked: tuple[TestClient, dict[str, str]], name: str
) -> None:
    client, tokens = attacked
    reference = client.post("/search", json={"query": "x"}, headers=bearer("garbage"))
    assert reference.status_code == 401
    for method, path, body in ROUTES:
        headers = {"Authorization": f"Bearer {tokens[name]}".encode()}  # é is not ASCII
        response = client.request(method, path, json=body, headers=headers)
        assert response.status_code == 401, (name, path, response.text)
        assert response.headers["content-type"] == "application/problem+json"
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.content == reference.content


def test_a_valid_token_passes_where_the_attacks_fail(
    attacked: tuple[TestClient, dict[str, str]], make_token: TokenFactory
) -> None:
    """The same requests with a genuine token get alice's evidence, not merely a 200."""
    client, _ = attacked
    answered = {}
    for method, path, body in ROUTES[:4]:
        response = client.request(method, path, json=body, headers=bearer(make_token()))
        assert response.status_code == 200, (path, response.text)
        answered[path] = response.json()
    assert answered["/search"]["results"][0]["chunk_id"] == "refund-policy@2:0"
    assert "RPL-14" in answered["/search"]["results"][0]["text"]
    assert answered["/answer"]["abstained"] is False
    assert "refund-policy@2:0" in {c["chunk_id"] for c in answered["/answer"]["citations"]}
    document = answered["/documents/refund-policy"]
    assert (document["doc_id"], document["version"]) == ("refund-policy", "2")
    assert answered["/chunks/refund-policy%402%3A0"]["chunk_id"] == "refund-policy@2:0"


@pytest.mark.parametrize(
    "header",
    ["Basic YWxpY2U6c2VjcmV0", "Bearer", "Bearer  ", "Token abc", "bearer garbage"],
)
def test_other_authorization_forms_are_401(
    attacked: tuple[TestClient, dict[str, str]], header: str
) -> None:
    client, _ = attacked
    response = client.post("/search", json={"query": "x"}, headers={"Authorization": header})
    assert response.status_code == 401
    assert response.json()["code"] == "unauthenticated"
