"""A caller's directory entry: the groups SCIM gave it, and whether it may act at all.

A verified token names a user of the directory when its `directory.user_claim` equals the
user's `directory.user_attribute` (docs/policy.md, "directory"), in the token's tenant.
Such a caller holds `group:<displayName>` for each directory group that holds it, beside
its token's groups; while the user is inactive, or once it was deleted (the directory keeps
a tombstone), every request is
refused (403 `account_disabled`), whatever the token says. A tenant that never had a
directory costs one dictionary look-up.

Entries are cached per (tenant, attribute, value) with the tenant's directory version
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
from collections.abc import Mapping
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
log = logging.getLogger("gateway.authn")


class DirectoryIdentity:
    def __init__(self, directory: Directory, versions: DirectoryVersions) -> None:
        self._directory, self.versions = directory, versions
        self._cache: collections.OrderedDict[tuple[str, str, str], tuple[int, Entry | None]]
        self._cache = collections.OrderedDict()
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

    def groups_for(self, claims: Mapping[str, Any], policy: Policy) -> tuple[str, ...] | None:
        """The directory groups of the caller these claims name; None when the directory
        knows no such user. 403 `account_disabled` for an inactive user. Blocking: a
        request on the event loop asks `resolve`."""
        key = self._key(claims, policy)
        if key is None:
            tenant = _unnamed(claims, policy)
            if tenant is not None and tenant in self.versions.current():
                _refuse_unnamed(tenant, policy)
            return None
        return _decided(self.entry(*key))

    async def resolve(self, claims: Mapping[str, Any], policy: Policy) -> tuple[str, ...] | None:
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
        found = self._cached(*key)
        if found is _MISS:
            found = await asyncio.to_thread(self.entry, *key)
        assert found is None or isinstance(found, Entry)
        return _decided(found)

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


def _decided(found: Entry | None) -> tuple[str, ...] | None:
    if found is None:
        return None
    if not found.active:
        raise GatewayError("account_disabled", DISABLED_DETAIL)
    return found.groups
