"""For the measurement scripts: the installed `gateway` command, run as a real server."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from gateway.authn.devkeys import SigningKey, generate_signing_key, write_jwks


def gateway_command() -> str:
    """The `gateway` of this interpreter's environment, not whichever is first on PATH."""
    return shutil.which("gateway", path=str(Path(sys.executable).parent)) or "gateway"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_gateway(arguments: list[str], env: Mapping[str, str] | None = None) -> Iterator[str]:
    """`gateway <arguments> --port P` in the background; yields its base URL once /readyz
    answers 200, and stops it on the way out."""
    port = free_port()
    server = subprocess.Popen(
        [gateway_command(), *arguments, "--port", str(port)],
        env=dict(env) if env is not None else None,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"gateway {arguments[0]} exited with {server.returncode}")
            try:
                if httpx.get(f"{base}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        yield base
    finally:
        server.terminate()
        server.wait()


@dataclass(frozen=True)
class ThrowawayIssuer:
    """A signing key whose JWKS the served gateway trusts, and the settings saying so."""

    key: SigningKey
    env: dict[str, str]

    def token(
        self, tenant: str = "acme", region: str = "EU", groups: tuple[str, ...] = ("staff",)
    ) -> str:
        claims = {"iss": "https://m", "aud": "m", "sub": "u", "tenant": tenant, "region": region}
        return self.key.sign({**claims, "groups": list(groups), "exp": int(time.time()) + 3600})


def throwaway_issuer(work: Path, data: Path) -> ThrowawayIssuer:
    """An issuer for one measurement: its JWKS in `work`, the gateway serving `data`."""
    key = generate_signing_key("ES256", kid="measure")
    write_jwks(work / "jwks.json", key.public_jwks())
    env = {
        **os.environ,
        "GATEWAY_DATA_DIR": str(data),
        "GATEWAY_OIDC_ISSUER": "https://m",
        "GATEWAY_OIDC_AUDIENCE": "m",
        "GATEWAY_JWKS_URI": (work / "jwks.json").as_uri(),
    }
    return ThrowawayIssuer(key, env)
