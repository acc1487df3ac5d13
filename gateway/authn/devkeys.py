"""Real signing keys for tests and the local demo issuer: the issuing half of the JWT boundary."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from joserfc import jwt
from joserfc.jwk import ECKey, KeyParameters, RSAKey


@dataclass(frozen=True)
class SigningKey:
    """A private key with its `kid` and `alg`; signs JWTs and publishes its public JWK."""

    alg: str
    kid: str
    _key: RSAKey | ECKey = field(repr=False)  # private material stays out of reprs

    def public_jwk(self) -> dict[str, Any]:
        return dict(self._key.as_dict(private=False))

    def public_jwks(self) -> dict[str, Any]:
        return {"keys": [self.public_jwk()]}

    def public_pem(self) -> bytes:
        return self._key.as_pem(private=False)

    def private_pem(self) -> bytes:
        """PKCS#8 PEM, for signers outside joserfc (tests forging exotic headers)."""
        return self._key.as_pem(private=True)

    def sign(self, claims: dict[str, Any], headers: dict[str, Any] | None = None) -> str:
        """Compact JWS of `claims`; a header given as None is left out (e.g. {"kid": None})."""
        merged = {"alg": self.alg, "kid": self.kid, **(headers or {})}
        header = {name: value for name, value in merged.items() if value is not None}
        # joserfc rewrites datetime claims in place; the caller's dict stays untouched.
        return jwt.encode(header, dict(claims), self._key, algorithms=[header["alg"]])


def generate_signing_key(alg: str = "RS256", kid: str | None = None) -> SigningKey:
    """A fresh RS256 (RSA 2048) or ES256 (P-256) key; `kid` defaults to its RFC 7638 thumbprint."""
    params: KeyParameters = {"use": "sig", "alg": alg}
    if kid is not None:
        params["kid"] = kid
    key: RSAKey | ECKey
    if alg == "RS256":
        key = RSAKey.generate_key(2048, parameters=params, auto_kid=kid is None)
    elif alg == "ES256":
        key = ECKey.generate_key("P-256", parameters=params, auto_kid=kid is None)
    else:
        raise ValueError(f"unsupported signing algorithm {alg!r}")
    assert key.kid is not None
    return SigningKey(alg=alg, kid=key.kid, _key=key)


def load_signing_key(pem: bytes, alg: str, kid: str) -> SigningKey:
    """A key saved with `private_pem()`, back as a signer."""
    params: KeyParameters = {"use": "sig", "alg": alg, "kid": kid}
    key: RSAKey | ECKey
    if alg == "RS256":
        key = RSAKey.import_key(pem, parameters=params)
    elif alg == "ES256":
        key = ECKey.import_key(pem, parameters=params)
    else:
        raise ValueError(f"unsupported signing algorithm {alg!r}")
    return SigningKey(alg=alg, kid=kid, _key=key)


def jwks_of(*keys: SigningKey) -> dict[str, Any]:
    """One JWKS publishing several keys, as an issuer does while rotating."""
    return {"keys": [key.public_jwk() for key in keys]}


def write_jwks(path: str | os.PathLike[str], jwks: dict[str, Any]) -> None:
    """Write atomically, so a verifier refetching mid-rotation never reads half a file."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".jwks-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(jwks, handle, indent=2)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
