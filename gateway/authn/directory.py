"""A caller's directory entry: the groups SCIM gave it, and whether it may act at all.

A verified token names a user of the directory when its `directory.user_claim` equals the
user's `directory.user_attribute` (docs/policy.md, "directory"), in the token's tenant.
Such a caller holds `group:<displayName>` for each directory group that holds it, beside
its token's groups; and the directory decides for the groups it manages: a group of the
token's `groups` claim that is the displayName of a group of the tenant's directory, or
was one before that group was deleted or renamed, counts only while the directory holds
the user in a group of that name (the claim is narrowed in place), so a membership
removed, or a group renamed or deleted, is enforced whatever the token lists. A token
naming only a former userName or externalId of active users is narrowed by their
memberships alike, and granted none of their groups. While the user is inactive, or once
it was deleted (the directory keeps a tombstone), every request is refused (403
`account_disabled`), whatever the token says; so is a token issued (`iat`) before the user
was given a userName or externalId that someone held before: it is the former holder's.
A tenant that never had a directory costs one dictionary look-up.

Entries, and each tenant's group names, are cached with the tenant's directory version
they were read at; the version is checked on every request (directory_versions.py), so a
change is enforced by the next request, and a cache hit costs a few dictionary look-ups.
A request asks `resolve`: a hit is answered on the event loop, and only a miss (a poll of
the versions with a database server, or the entry's query) goes to a worker thread, so a
slow catalog never stalls the other requests of the process.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Mapping, MutableMapping
from typing import Any

from gateway.errors import GatewayError
from gateway.policy.model import Policy
from gateway.storage.directory import Directory, Entry
from gateway.storage.directory_versions import DirectoryVersions

_MISS = object()  # `_cached`: the database must be asked
CACHED_ENTRIES = 100_000  # a bound on memory; an evicted entry costs one query again
# Who was deprovisioned is a decision about a person, so the detail says no more than this.
DISABLED_DETAIL = "this account is disabled in the directory"
UNNAMED_DETAIL = "this tenant has a directory: the token must carry its user claim"
# GATEWAY_JWT_LEEWAY_S's default: the clock skew a token's `iat` is allowed against the
# moment a recycled userName was given to its new holder (the app passes the configured
# one, gateway.authn.tokens.leeway_s).
LEEWAY_S = 30
log = logging.getLogger("gateway.authn")


class DirectoryIdentity:
    def __init__(
        self, directory: Directory, versions: DirectoryVersions, leeway_s: float = LEEWAY_S
    ) -> None:
        self._directory, self.versions, self._leeway_s = directory, versions, leeway_s
        self._cache: collections.OrderedDict[tuple[str, str, str], tuple[int, Entry | None]]
        self._cache = collections.OrderedDict()
        # tenant -> (version, the displayNames it manages, `managed`): one set per tenant,
        # shared by all its users, read once per version.
        self._names: dict[str, tuple[int, frozenset[str]]] = {}
        self._lock = threading.Lock()

    def entry(self, tenant: str, attribute: str, value: str) -> Entry | None:
        """The directory's entry for this user, as of the tenant's current version."""
        version = self.versions.current().get(tenant)
        if version is None:
            return None  # the tenant has never had a directory
        key = (tenant, attribute, value)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] == version:
                return hit[1]
        found = self._directory.entry(tenant, attribute, value)
        with self._lock:
            self._cache[key] = (version, found)
            self._cache.move_to_end(key)
            while len(self._cache) > CACHED_ENTRIES:
                self._cache.popitem(last=False)
        return found

    def managed(self, tenant: str) -> frozenset[str]:
        """The displayNames the tenant's directory decides for, as of its current version:
        its groups', and those its groups had before they were deleted or renamed (a name
        the directory ever managed stays its own to grant)."""
        version = self.versions.current().get(tenant)
        if version is None:
            return frozenset()
        with self._lock:
            hit = self._names.get(tenant)
            if hit is not None and hit[0] == version:
                return hit[1]
        names = frozenset(self._directory.managed_names(tenant))
        with self._lock:
            self._names[tenant] = (version, names)
        return names

    def _cached(self, tenant: str, attribute: str, value: str) -> Entry | None | object:
        """The entry if answering costs no query; `_MISS` when the database must be asked."""
        versions = self.versions.peek()
        if versions is None:
            return _MISS  # the polled versions are stale: polling is a query
        version = versions.get(tenant)
        if version is None:
            return None  # the tenant has never had a directory
        with self._lock:
            hit = self._cache.get((tenant, attribute, value))
        return hit[1] if hit is not None and hit[0] == version else _MISS

    def _cached_names(self, tenant: str) -> frozenset[str] | None:
        """`managed` if answering costs no query; None when the database must be asked."""
        versions = self.versions.peek()
        version = versions.get(tenant) if versions is not None else None
        with self._lock:
            hit = self._names.get(tenant)
        return hit[1] if hit is not None and version is not None and hit[0] == version else None

    def groups_for(
        self, claims: MutableMapping[str, Any], policy: Policy
    ) -> tuple[str, ...] | None:
        """The directory groups of the caller these claims name; None when the directory
        knows no such user, () when they name only a former value of active users. 403
        `account_disabled` for an inactive user, or a token of a former holder of its name.
        The claims' groups are narrowed to those the directory allows (`_narrowed`).
        Blocking: a request on the event loop asks `resolve`."""
        key = self._key(claims, policy)
        if key is None:
            tenant = _unnamed(claims, policy)
            if tenant is not None and tenant in self.versions.current():
                _refuse_unnamed(tenant, policy)
            return None
        found = self._decided(self.entry(*key), claims, key[0])
        if found is None:
            return None
        _narrowed(claims, policy, _allowed(found), self.managed(key[0]))
        return found.groups

    async def resolve(
        self, claims: MutableMapping[str, Any], policy: Policy
    ) -> tuple[str, ...] | None:
        """`groups_for` for the event loop: a cache hit at once, a miss in a thread."""
        key = self._key(claims, policy)
        if key is None:
            tenant = _unnamed(claims, policy)
            if tenant is not None:
                versions = self.versions.peek()
                if versions is None:
                    versions = await asyncio.to_thread(self.versions.current)
                if tenant in versions:
                    _refuse_unnamed(tenant, policy)
            return None
        cached = self._cached(*key)
        if cached is _MISS:
            cached = await asyncio.to_thread(self.entry, *key)
        assert cached is None or isinstance(cached, Entry)
        found = self._decided(cached, claims, key[0])
        if found is None:
            return None
        names = self._cached_names(key[0])
        if names is None:
            names = await asyncio.to_thread(self.managed, key[0])
        _narrowed(claims, policy, _allowed(found), names)
        return found.groups

    def _decided(self, found: Entry | None, claims: Mapping[str, Any], tenant: str) -> Entry | None:
        """The entry of a caller that may act; None for one the directory does not know."""
        if found is None:
            return None
        if not found.active:
            raise GatewayError("account_disabled", DISABLED_DETAIL)
        issued = claims.get("iat")
        if (
            found.since is not None
            and isinstance(issued, (int, float))
            and not isinstance(issued, bool)
            and issued < found.since - self._leeway_s
        ):
            # The name was given to this user after the token was issued: the token is its
            # former holder's, whose account is gone, so it is refused as a tombstone's is.
            # A token without `iat` cannot tell and passes as before (docs/security.md,
            # "Deprovisioning is enforced on the next request").
            log.info("a token of tenant %s issued before its user was provisioned", tenant)
            raise GatewayError("account_disabled", DISABLED_DETAIL)
        return found

    @staticmethod
    def _key(claims: Mapping[str, Any], policy: Policy) -> tuple[str, str, str] | None:
        tenant = claims.get(policy.claims.tenant)
        value = claims.get(policy.directory.user_claim)
        if not isinstance(tenant, str) or not isinstance(value, str) or not value:
            return None
        return tenant, policy.directory.user_attribute, value


def _unnamed(claims: Mapping[str, Any], policy: Policy) -> str | None:
    """The tenant of claims that name a tenant but no directory user (the user claim is
    missing, empty or not a string)."""
    tenant = claims.get(policy.claims.tenant)
    value = claims.get(policy.directory.user_claim)
    named = isinstance(value, str) and bool(value)
    return tenant if isinstance(tenant, str) and not named else None


def _refuse_unnamed(tenant: str, policy: Policy) -> None:
    """A token of a tenant with a directory must name its directory user: otherwise a
    deactivated user could ask the identity provider for a token without that claim (an
    `email` or `upn` left out of its scopes) and pass as a caller the directory does not
    know (docs/security.md, "Deprovisioning is enforced on the next request")."""
    claim = policy.directory.user_claim
    log.warning("a token of tenant %s without its directory user claim %r refused", tenant, claim)
    raise GatewayError("insufficient_claims", f"{UNNAMED_DETAIL} ({claim})")


def _allowed(found: Entry) -> tuple[str, ...]:
    """The managed token groups this entry lets count: its groups, or for a former value
    of active users (granted none) the groups those users are in."""
    return found.groups if found.kept is None else found.kept


def _narrowed(
    claims: MutableMapping[str, Any], policy: Policy, held: tuple[str, ...], names: frozenset[str]
) -> None:
    """Drop from the token's `groups` claim each group the directory manages (`names`: its
    groups' displayNames, current or former) and does not hold this user in (`held`): for
    those the directory decides, so a membership SCIM removed, or a group deleted or
    renamed, is enforced before the token expires. A group the directory never had stays,
    and the claim is left alone (same object) when nothing goes."""
    claim = policy.claims.groups
    listed = claims.get(claim)
    if not isinstance(listed, list) or not names:
        return
    kept = [g for g in listed if not isinstance(g, str) or g not in names or g in held]
    if len(kept) < len(listed):
        claims[claim] = kept
