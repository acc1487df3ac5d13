"""The local development issuer: a signing key and JWKS in the data dir, for the demo only.

Its tokens are trusted only when GATEWAY_DEV_ISSUER is explicitly true, by a server bound
to a loopback address (`gateway serve` refuses any other), and never instead of or beside
a configured identity provider: a deployment that names its own issuer, audience or JWKS
never loads these keys.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.authn.devkeys import SigningKey, generate_signing_key, load_signing_key, write_jwks
from gateway.errors import GatewayError
from gateway.settings import Settings

DEV_ISSUER = "urn:gateway:dev-issuer"
DEV_AUDIENCE = "rag-gateway"
DEV_KID = "dev-issuer-1"
DEV_ALG = "ES256"


def dev_issuer_dir(data_dir: Path) -> Path:
    return data_dir / "dev-issuer"


@dataclass(frozen=True)
class DevIssuer:
    key: SigningKey
    jwks_path: Path

    def mint(
        self,
        sub: str,
        tenant: str,
        region: str,
        groups: list[str],
        ttl_s: int = 12 * 3600,
        **extra: Any,
    ) -> str:
        now = int(time.time())
        claims = {
            "iss": DEV_ISSUER,
            "aud": DEV_AUDIENCE,
            "sub": sub,
            "tenant": tenant,
            "region": region,
            "groups": groups,
            "iat": now,
            "exp": now + ttl_s,
            **extra,
        }
        return self.key.sign(claims)


def ensure_dev_issuer(data_dir: Path) -> DevIssuer:
    """Load the data dir's dev issuer, creating its key (mode 0600) on first use."""
    directory = dev_issuer_dir(data_dir)
    directory.mkdir(parents=True, exist_ok=True)
    private = directory / "signing-key.pem"
    if private.exists():
        key = load_signing_key(private.read_bytes(), DEV_ALG, DEV_KID)
    else:
        key = generate_signing_key(DEV_ALG, kid=DEV_KID)
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(key.private_pem())
    jwks = directory / "jwks.json"
    write_jwks(jwks, key.public_jwks())
    return DevIssuer(key, jwks)


def resolve_identity(settings: Settings) -> Settings:
    """With the dev issuer explicitly enabled, the identity settings are the dev issuer's.
    A configured identity provider beside it is refused: its tokens would otherwise be
    checked against the dev keys (or the dev keys trusted in its place)."""
    if not settings.dev_issuer:
        return settings
    jwks = dev_issuer_dir(settings.data_dir) / "jwks.json"
    dev = {
        "oidc_issuer": DEV_ISSUER,
        "oidc_audience": DEV_AUDIENCE,
        "jwks_uri": jwks.resolve().as_uri(),
    }
    foreign = [
        f"GATEWAY_{name.upper()}"
        for name, value in dev.items()
        if getattr(settings, name) not in ("", value)
    ]
    if foreign:
        raise GatewayError(
            "forbidden",
            "GATEWAY_DEV_ISSUER trusts only the demo's own issuer; it is refused beside a "
            f"configured identity provider ({', '.join(foreign)}): unset one or the other",
        )
    return settings.model_copy(update=dev)
