"""The test issuer, tokens and settings that point a gateway at it; forged tokens that must fail."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from gateway.authn.devkeys import SigningKey, generate_signing_key
from gateway.authn.tokens import MAX_TOKEN_CHARS
from gateway.settings import Settings

LEEWAY = 30


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64json(obj: Any) -> str:
    return b64(json.dumps(obj).encode())


def raw_rs256(key: SigningKey, header: Any, payload: bytes) -> str:
    """Sign outside joserfc, so tokens joserfc would refuse to produce can still be forged."""
    private = serialization.load_pem_private_key(key.private_pem(), password=None)
    assert isinstance(private, rsa.RSAPrivateKey)
    signing_input = f"{b64json(header)}.{b64(payload)}".encode()
    signature = private.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input.decode()}.{b64(signature)}"


def claims(**overrides: Any) -> dict[str, Any]:
    """Valid claims; an override of None removes the claim."""
    now = int(time.time())
    base: dict[str, Any] = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "alice-7f3a",
        "iat": now,
        "nbf": now,
        "exp": now + 300,
    }
    base.update(overrides)
    return {name: value for name, value in base.items() if value is not None}


ISSUER = "https://issuer.test"


AUDIENCE = "rag-gateway"


TokenFactory = Callable[..., str]


def make_settings(data_dir: Path, jwks_file: Path, policy_dir: Path | None = None) -> Settings:
    return Settings(
        data_dir=data_dir,
        policy_dir=policy_dir,
        oidc_issuer=ISSUER,
        oidc_audience=AUDIENCE,
        jwks_uri=jwks_file.as_uri(),
    )


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def forged_tokens(rsa: SigningKey, ec: SigningKey) -> dict[str, str]:
    """Every way a token must fail, each otherwise plausible; built fresh (times matter)."""
    now = int(time.time())
    good = rsa.sign(claims())
    header_b64, _, signature = good.split(".")
    payload = json.dumps(claims()).encode()
    payload_b64 = b64(payload)

    def unsigned(alg: str) -> str:
        return f"{b64json({'alg': alg, 'typ': 'JWT', 'kid': rsa.kid})}.{payload_b64}."

    def hs256(secret: bytes) -> str:
        signing_input = f"{b64json({'alg': 'HS256', 'typ': 'JWT', 'kid': rsa.kid})}.{payload_b64}"
        mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
        return f"{signing_input}.{b64(mac)}"

    impostor = generate_signing_key("RS256", kid=rsa.kid)
    attacker = generate_signing_key("ES256", kid="attacker")
    return {
        "alg none": unsigned("none"),
        "alg None": unsigned("None"),
        "alg none with signature": unsigned("none") + signature,
        "hs256 public pem": hs256(rsa.public_pem()),
        "hs256 public jwk json": hs256(json.dumps(rsa.public_jwk()).encode()),
        "hs256 public jwk compact": hs256(
            json.dumps(rsa.public_jwk(), separators=(",", ":")).encode()
        ),
        "rs384 header": unsigned("RS384") + signature,
        "tampered payload": f"{header_b64}.{b64json(claims(sub='admin'))}.{signature}",
        "tampered header": f"{b64json({'alg': 'RS256', 'kid': ec.kid})}.{payload_b64}.{signature}",
        "stripped signature": f"{header_b64}.{payload_b64}.",
        "different key same kid": impostor.sign(claims()),
        "ec signature with rsa kid": ec.sign(claims(), headers={"kid": rsa.kid}),
        "unknown kid": attacker.sign(claims()),
        "no kid with several keys": rsa.sign(claims(), headers={"kid": None}),
        "expired beyond leeway": rsa.sign(
            claims(iat=now - 900, nbf=now - 900, exp=now - LEEWAY - 60)
        ),
        "nbf in future": rsa.sign(claims(nbf=now + LEEWAY + 60)),
        "iat in future": rsa.sign(claims(iat=now + LEEWAY + 60)),
        "missing exp": rsa.sign(claims(exp=None)),
        "exp not a number": rsa.sign(claims(exp=str(now + 300))),
        "exp boolean": rsa.sign(claims(exp=True)),
        "wrong iss": rsa.sign(claims(iss="https://evil.test")),
        "iss with trailing slash": rsa.sign(claims(iss=ISSUER + "/")),
        "missing iss": rsa.sign(claims(iss=None)),
        "wrong aud": rsa.sign(claims(aud="other-api")),
        "aud list without ours": rsa.sign(claims(aud=["other-api", "third"])),
        "missing aud": rsa.sign(claims(aud=None)),
        "unknown crit header": raw_rs256(
            rsa, {"alg": "RS256", "kid": rsa.kid, "crit": ["x-must"], "x-must": 1}, payload
        ),
        "signed payload not an object": raw_rs256(rsa, {"alg": "RS256", "kid": rsa.kid}, b"[1, 2]"),
        "signed payload not json": raw_rs256(rsa, {"alg": "RS256", "kid": rsa.kid}, b"{"),
        "signed header is a string": raw_rs256(rsa, "xalgx", payload),
        "signed kid not a string": raw_rs256(rsa, {"alg": "RS256", "kid": ["rsa-1"]}, payload),
        "header is a string": f"{b64json('xalgx')}.{payload_b64}.{signature}",
        "jwe shaped": "a.b.c.d.e",
        "oversized": rsa.sign(claims(pad="x" * MAX_TOKEN_CHARS)),
        "empty": "",
        "garbage": "not-a-token",
        "dots only": "..",
        "three junk parts": "a.b.c",
        "bad base64 header": "!!!.e30.AAAA",
        "non ascii": "é.é.é",
        "whitespace": " " + good,
    }


# Why each forgery fails, as logged: a forgery rejected for another reason would hide a gap.
EXPECTED_REASON = {
    **dict.fromkeys(
        [
            "alg none",
            "alg None",
            "alg none with signature",
            "hs256 public pem",
            "hs256 public jwk json",
            "hs256 public jwk compact",
            "rs384 header",
        ],
        "algorithm not allowed",
    ),
    **dict.fromkeys(
        ["tampered payload", "stripped signature", "different key same kid"], "bad_signature"
    ),
    **dict.fromkeys(
        ["tampered header", "ec signature with rsa kid", "unknown kid", "no kid with several keys"],
        "no key for kid",
    ),
    "expired beyond leeway": "claim exp: expired_token",
    "nbf in future": "claim nbf: invalid_claim",
    "iat in future": "claim iat: invalid_claim",
    "missing exp": "claim exp: missing_claim",
    "exp not a number": "claim exp: invalid_claim",
    "exp boolean": "claim exp: invalid_claim",
    "wrong iss": "claim iss: invalid_claim",
    "iss with trailing slash": "claim iss: invalid_claim",
    "missing iss": "claim iss: missing_claim",
    "wrong aud": "claim aud: invalid_claim",
    "aud list without ours": "claim aud: invalid_claim",
    "missing aud": "claim aud: missing_claim",
    "unknown crit header": "unsupported_header",
    "signed payload not an object": "invalid_payload",
    "signed payload not json": "invalid_payload",
    "signed header is a string": "malformed header",
    "header is a string": "malformed header",
    "signed kid not a string": "malformed kid",
    **dict.fromkeys(
        [
            "jwe shaped",
            "garbage",
            "dots only",
            "three junk parts",
            "bad base64 header",
            "whitespace",
        ],
        "decode_error",
    ),
    "oversized": "token too large",
    "empty": "missing token",
    "non ascii": "non-ASCII token",
}
