"""Verify caller bearer JWTs against the issuer's JWKS; the one module that speaks joserfc."""

from __future__ import annotations

import asyncio
import collections
import copy
import json
import logging
import math
import ssl
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from urllib.request import url2pathname

import httpx
from joserfc import jws, jwt
from joserfc.errors import ClaimError, InvalidKeyIdError, JoseError
from joserfc.jwk import JWKRegistry, Key, KeySet

from gateway.errors import GatewayError
from gateway.settings import Settings

ALLOWED_ALGS = ("RS256", "ES256")
MAX_TOKEN_CHARS = 32 * 1024
MAX_LEEWAY_S = 60
# Signatures verified, remembered per token: a caller sends one token for many requests,
# and checking an ES256 signature is most of the 0.35 ms authentication costs.
VERIFIED_TOKENS = 1024
# One text for every cause, so a caller cannot probe which check failed.
GENERIC_DETAIL = "invalid or missing bearer token"

log = logging.getLogger("gateway.authn")

# RFC 7515 s4: unknown non-critical header parameters must be ignored; joserfc's default
# registry rejects them, which would lock out IdPs that add harmless extras. `crit` is
# still enforced, and the allow-list is checked again inside joserfc.
_JWS_REGISTRY = jws.JWSRegistry(algorithms=ALLOWED_ALGS, strict_check_header=False)


class _Rejected(Exception):
    """Why a token failed: logged for operators, never shown to the caller."""


class _Untrusted(ValueError):
    """The issuer's discovery document fails a check (another issuer, a jwks_uri not
    https): a refusal to trust it, answered 401 like any bad token, not an outage."""


class TokenVerifier:
    """Verifies RS256/ES256 bearer JWTs: signature, `iss`, `aud`, `exp`, `nbf`, `iat`."""

    def __init__(
        self,
        settings: Settings,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`transport` reaches the issuer (tests fake it); `clock` paces JWKS refetches."""
        self._settings = settings
        self._http = httpx.AsyncClient(
            transport=transport, timeout=settings.http_timeout_s, verify=_trust(settings)
        )
        self._clock = clock
        self._keys: KeySet | None = None
        # Whether the last fetch failed for want of the issuer (transport, file, JSON), as
        # opposed to a discovery document refused as untrusted.
        self._outage = False
        self._discovered_jwks_uri: str | None = None
        self.fetches: collections.Counter[str] = collections.Counter()  # ok, failed (metrics)
        self._last_fetch: float | None = None
        self._loaded_at: float | None = None  # when the keys in use were fetched
        self._background: asyncio.Task[None] | None = None
        # Concurrent misses wait for one fetch instead of each calling the issuer.
        self._lock = asyncio.Lock()
        # raw token -> (the key that verified its signature, its claims), newest last.
        self._signed: collections.OrderedDict[bytes, tuple[Key, dict[str, Any]]] = (
            collections.OrderedDict()
        )

    async def verify(self, token: str, audiences: Sequence[str] = ()) -> dict[str, Any]:
        """Verified claims, or raise GatewayError("unauthenticated") with a generic detail
        (or "not_ready" while the issuer's keys cannot be loaded at all). `aud` must hold
        OIDC_AUDIENCE or one of `audiences` (a route's own resource URI)."""
        header: Any = None
        try:
            raw = _shape_checked(token)
            header = jws.extract_compact(raw, registry=_JWS_REGISTRY).headers()
            return await self._verify(raw, header, audiences)
        except _Rejected as exc:
            reason = str(exc)
        except ClaimError as exc:
            # The claim name only: descriptions and values stay out of the logs.
            reason = f"claim {exc.claim}: {exc.error}"
        except JoseError as exc:
            reason = exc.error or type(exc).__name__
        except GatewayError:
            raise  # 503 not_ready: the issuer's keys could not be loaded (`_key_for`)
        except Exception as exc:  # hostile input must end as a 401, never a 500
            reason = f"malformed token ({type(exc).__name__})"
        kid, alg = self._loggable(header)
        log.info("bearer token rejected: %s (kid=%s alg=%s)", reason, kid, alg)
        raise GatewayError("unauthenticated", GENERIC_DETAIL)

    def _loggable(self, header: Any) -> tuple[str, str]:
        """The header's kid and alg as the log may show them: the caller writes the
        header, so only a kid of a key we hold and an allowed alg are logged as sent."""
        fields = header if isinstance(header, dict) else {}
        known = [key.kid for key in self._keys] if self._keys is not None else []
        return _shown(fields.get("kid"), known), _shown(fields.get("alg"), ALLOWED_ALGS)

    async def aclose(self) -> None:
        if self._background is not None:
            self._background.cancel()
        await self._http.aclose()

    async def _verify(self, raw: bytes, header: Any, audiences: Sequence[str]) -> dict[str, Any]:
        settings = self._settings
        if not isinstance(header, dict):
            # joserfc accepts any JSON whose text contains "alg", e.g. the string "xalgx".
            raise _Rejected("malformed header")
        if not settings.oidc_issuer or not settings.oidc_audience:
            raise _Rejected("issuer or audience not configured")  # fail closed
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or alg not in ALLOWED_ALGS:
            raise _Rejected("algorithm not allowed")
        if kid is not None and not isinstance(kid, str):
            raise _Rejected("malformed kid")
        key = await self._key_for(kid, alg)
        claims = self._signed_claims(raw, key)
        claims_registry = jwt.JWTClaimsRegistry(
            leeway=leeway_s(settings),
            iss={"essential": True, "value": settings.oidc_issuer},
            # Any one value in `aud` matching any of these passes (joserfc's check_value).
            aud={"essential": True, "values": [settings.oidc_audience, *audiences]},
            exp={"essential": True},
        )
        claims_registry.validate(claims)  # nbf and iat are checked when present
        return copy.deepcopy(claims)  # the remembered claims stay as they were signed

    def _signed_claims(self, raw: bytes, key: Key) -> dict[str, Any]:
        """The claims of `raw`, whose signature `key` verifies; remembered for the same
        key object only: a JWKS fetched again makes new ones, so a token whose key the
        issuer removed is checked against the new set and refused. The claims are checked
        again on every request (exp, nbf, iss, aud)."""
        remembered = self._signed.get(raw)
        if remembered is not None and remembered[0] is key:
            self._signed.move_to_end(raw)
            return remembered[1]
        token = jwt.decode(raw, key, algorithms=ALLOWED_ALGS, registry=_JWS_REGISTRY)
        claims = dict(token.claims)
        self._signed[raw] = (key, claims)
        if len(self._signed) > VERIFIED_TOKENS:
            self._signed.popitem(last=False)
        return claims

    async def _key_for(self, kid: str | None, alg: str) -> Key:
        key = self._find(kid, alg)
        fetch_failed = False
        if key is None:
            async with self._lock:
                # Re-check: the request we waited for may have fetched the key already.
                key = self._find(kid, alg)
                if key is None and self._may_fetch():
                    fetch_failed = not await self._refresh()
                    key = self._find(kid, alg)
        if key is None and self._keys is None and self._outage:
            # No key set was ever loaded because the issuer cannot be reached: the token may
            # well be good, and a 401 would make the client throw it away. A failing
            # dependency is a 503 to retry, as the catalog's or the index store's are.
            raise GatewayError(
                "not_ready",
                "the identity provider's signing keys cannot be loaded; retry shortly",
                headers={"Retry-After": str(self._retry_after())},
            )
        if key is None and fetch_failed:
            raise _Rejected("JWKS unavailable")  # the keys known before lack this kid
        if key is None:
            raise _Rejected("no key for kid" if self._keys is not None else "no JWKS loaded")
        self._refresh_if_stale()
        return key

    def _retry_after(self) -> int:
        """Seconds until the issuer is asked again (`_may_fetch`), at least 1."""
        last = self._last_fetch if self._last_fetch is not None else self._clock()
        wait = self._settings.jwks_refresh_min_interval_s - (self._clock() - last)
        return max(1, math.ceil(wait))

    def _refresh_if_stale(self) -> None:
        """Keys older than `jwks_refresh_interval_s` are fetched again in the background,
        so a key the issuer removed stops working within about one interval. The request
        that notices never waits for the issuer; a failed fetch keeps the keys it had."""
        interval = self._settings.jwks_refresh_interval_s
        loaded = self._loaded_at
        if interval <= 0 or loaded is None or self._clock() - loaded < interval:
            return
        if (self._background is not None and not self._background.done()) or (
            not self._may_fetch()
        ):
            return
        self._background = asyncio.create_task(self._refresh_in_background())

    async def _refresh_in_background(self) -> None:
        async with self._lock:
            await self._refresh()  # a failure is logged there; the old keys stay

    def _find(self, kid: str | None, alg: str) -> Key | None:
        if self._keys is None:
            return None
        try:
            # With one key and no kid joserfc returns that key; `alg`/`use` on a JWK must match.
            return self._keys.get_by_kid(kid, {"alg": alg, "use": "sig"})
        except InvalidKeyIdError:
            return None

    def _may_fetch(self) -> bool:
        # Unknown kids are attacker-controlled: at most one fetch per interval, failed or not,
        # so a flood of random kids (or an issuer outage) cannot turn into a flood of requests.
        last = self._last_fetch
        interval = self._settings.jwks_refresh_min_interval_s
        return last is None or self._clock() - last >= interval

    async def _refresh(self) -> bool:
        """Whether a key set was fetched; a failure is logged and keeps the keys we had."""
        self._last_fetch = self._clock()
        try:
            uri = self._settings.jwks_uri or self._discovered_jwks_uri or await self._discover()
            document = _jwks_shape(await self._get_json(uri))
        except Exception as exc:
            self.fetches["failed"] += 1
            # Keep the keys we had: an issuer hiccup must not log everybody out.
            self._discovered_jwks_uri = None
            self._outage = not isinstance(exc, _Untrusted)
            log.warning("JWKS fetch failed (%s)", type(exc).__name__)
            return False
        # A well-formed set replaces the old one even with no usable key in it: the keys
        # the issuer no longer publishes must stop working (then every token is refused).
        self._keys = _usable_keys(document)
        self._outage = False
        self._loaded_at = self._clock()
        if not self._settings.jwks_uri:
            self._discovered_jwks_uri = uri
        self.fetches["ok"] += 1
        return True

    async def discovery_document(self) -> dict[str, Any]:
        """The issuer's OpenID discovery document, fetched now (raises when it cannot be
        fetched, or names another issuer)."""
        issuer = self._settings.oidc_issuer
        doc = await self._get_json(issuer.rstrip("/") + "/.well-known/openid-configuration")
        # OIDC Discovery s4.3: the document must name the issuer we were configured with.
        if doc.get("issuer") != issuer:
            raise _Untrusted("discovery document names another issuer")
        return doc

    async def _discover(self) -> str:
        doc = await self.discovery_document()
        uri = doc.get("jwks_uri")
        if not isinstance(uri, str) or urlsplit(uri).scheme != "https":
            raise _Untrusted("discovery document lacks an https jwks_uri")
        return uri

    async def _get_json(self, uri: str) -> dict[str, Any]:
        parts = urlsplit(uri)
        if parts.scheme == "file":
            path = Path(url2pathname(parts.path))
            data: Any = json.loads(await asyncio.to_thread(path.read_bytes))
        elif parts.scheme == "https":  # never plain http: keys could be swapped on the path
            response = await self._http.get(uri, headers={"Accept": "application/json"})
            response.raise_for_status()
            data = response.json()
        else:
            raise ValueError(f"unsupported URI scheme {parts.scheme!r}")
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        return data


def leeway_s(settings: Settings) -> int:
    """The clock skew allowed for a token's times: `exp`, `nbf`, and the `iat` the directory
    compares with when a recycled userName was given (gateway/authn/directory.py)."""
    return min(settings.jwt_leeway_s, MAX_LEEWAY_S)


def _shown(value: Any, known: Sequence[str | None]) -> str:
    """`value` quoted when it is one of `known`; else only whether it was there."""
    if value is None:
        return "none"
    return repr(value) if isinstance(value, str) and value in known else "<unknown>"


def _trust(settings: Settings) -> ssl.SSLContext | bool:
    """The issuer's certificate is always verified: against GATEWAY_OIDC_CA_FILE's CAs
    when set (an issuer on a private CA), else the default trust store."""
    if settings.oidc_ca_file is None:
        return True
    return ssl.create_default_context(cafile=str(settings.oidc_ca_file))


def _shape_checked(token: str) -> bytes:
    """Cheap checks before any parsing: bounded size, compact JWS alphabet."""
    if not isinstance(token, str) or not token:
        raise _Rejected("missing token")
    if len(token) > MAX_TOKEN_CHARS:
        raise _Rejected("token too large")
    if not token.isascii():
        raise _Rejected("non-ASCII token")
    return token.encode("ascii")


def _jwks_shape(data: dict[str, Any]) -> list[dict[str, Any]]:
    keys = data.get("keys")
    if not isinstance(keys, list) or not all(isinstance(key, dict) for key in keys):
        raise ValueError("JWKS lacks a list of keys")
    return keys


def _usable_keys(jwks: list[dict[str, Any]]) -> KeySet:
    """The keys of a JWKS that import, each on its own (RFC 7517 s5: a key of an unknown
    type, curve or with a member missing is ignored): one odd key the issuer publishes
    beside its signing keys must not make the whole set, and so its rotation, fail."""
    keys: list[Key] = []
    for jwk in jwks:
        try:
            key = JWKRegistry.import_key(jwk)
            key.ensure_kid()
        except Exception as exc:
            # A string kid only, bounded: never a member that could be key material.
            kid = jwk.get("kid")
            shown = repr(kid[:64]) if isinstance(kid, str) else "<malformed>"
            log.warning("JWKS key skipped (kid=%s): %s", shown, type(exc).__name__)
            continue
        keys.append(key)
    if not keys:
        log.warning("JWKS holds no usable key: every token is refused until it does")
    return KeySet(keys)
