"""A caller's directory entry: the groups SCIM gave it, and whether it may act at all.

A verified token names a user of the directory when its `directory.user_claim` equals the
user's `directory.user_attribute` (docs/policy.md, "directory"), in the token's tenant.
Such a caller holds `group:<displayName>` for each directory group that holds it, beside
its token's groups; and the directory decides for the groups it manages: a group of the
token's `groups` claim that is the displayName of a group of the tenant's directory, or
was one before that group was deleted or renamed, counts only while the directory holds
the user in a group of that name (`DirectoryGroups.withheld`: the claims are never edited,
so none are narrowed for another request that shares them), so a membership removed, or
a group renamed or deleted, is enforced whatever the token lists. A token
naming only a former userName or externalId of active users is narrowed by their
memberships alike, and granted none of their groups. While the user is inactive, or once
it was deleted (the directory keeps a tombstone), every request is refused (403
`account_disabled`), whatever the token says; so is a token issued (`iat`) before the user
was given a userName or externalId that someone held before: it is the former holder's.
A tenant that never had a directory costs one dictionary look-up.

Entries, and which of a token's groups the tenant's directory manages, are cached with the
tenant's directory version they were read at (`_AsOfVersion`); the version is checked on
every request (directory_versions.py), so a change is enforced by the next request, and a
cache hit costs a few dictionary look-ups. The managed names are asked for the token's
groups only, by index: a SCIM sync raises the version with every write, and reading all
of a tenant's group names after each of them cost one scan per request per write.
A request asks `resolve`: a hit is answered on the event loop, and only a miss (a poll of
the versions with a database server, or the entry's query) goes to a worker thread, so a
slow catalog never stalls the other requests of the process.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar

from gateway.domain import canonical_name
from gateway.errors import GatewayError
from gateway.policy.model import Policy
from gateway.policy.resolve import DirectoryGroups
from gateway.storage.directory import Directory, Entry
from gateway.storage.directory_versions import DirectoryVersions

_MISS = object()  # `_AsOfVersion.peek`: the database must be asked
CACHED_ENTRIES = 100_000  # a bound on memory; an evicted entry costs one query again
# Who was deprovisioned is a decision about a person, so the detail says no more than this.
DISABLED_DETAIL = "this account is disabled in the directory"
UNNAMED_DETAIL = "this tenant has a directory: the token must carry its user claim"
# GATEWAY_JWT_LEEWAY_S's default: the clock skew a token's `iat` is allowed against the
# moment a recycled userName was given to its new holder (the app passes the configured
# one, gateway.authn.tokens.leeway_s).
LEEWAY_S = 30
log = logging.getLogger("gateway.authn")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _AsOfVersion(Generic[K, V]):
    """Values read from tenants' directories, each kept with the tenant's version it was
    read at and answered while that version stands; at most `bound` of them, the least
    recently read evicted (an evicted value costs one query again)."""

    def __init__(self, versions: DirectoryVersions, bound: int) -> None:
        self._versions, self._bound = versions, bound
        self._kept: collections.OrderedDict[tuple[str, K], tuple[int, V]]
        self._kept = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, tenant: str, key: K, read: Callable[[], V]) -> V | None:
        """The value as of the tenant's current version, `read` on a miss; None for a
        tenant that never had a directory."""
        version = self._versions.current().get(tenant)
        if version is None:
            return None
        with self._lock:
            hit = self._kept.get((tenant, key))
            if hit is not None and hit[0] == version:
                return hit[1]
        value = read()  # read after the version: at worst newer than it, read again then
        with self._lock:
            self._kept[(tenant, key)] = (version, value)
            self._kept.move_to_end((tenant, key))
            while len(self._kept) > self._bound:
                self._kept.popitem(last=False)
        return value

    def peek(self, tenant: str, key: K) -> V | None | object:
        """`get` if answering costs no query; `_MISS` when the database must be asked."""
        versions = self._versions.peek()
        if versions is None:
            return _MISS  # the polled versions are stale: polling is a query
        version = versions.get(tenant)
        if version is None:
            return None  # the tenant has never had a directory
        with self._lock:
            hit = self._kept.get((tenant, key))
        return hit[1] if hit is not None and hit[0] == version else _MISS


class DirectoryIdentity:
    def __init__(
        self, directory: Directory, versions: DirectoryVersions, leeway_s: float = LEEWAY_S
    ) -> None:
        self._directory, self.versions, self._leeway_s = directory, versions, leeway_s
        self._entries: _AsOfVersion[tuple[str, str], Entry | None]
        self._entries = _AsOfVersion(versions, CACHED_ENTRIES)
        # A token's groups -> those of them the tenant's directory manages.
        self._managed: _AsOfVersion[frozenset[str], frozenset[str]]
        self._managed = _AsOfVersion(versions, CACHED_ENTRIES)

    def entry(self, tenant: str, attribute: str, value: str) -> Entry | None:
        """The directory's entry for this user, as of the tenant's current version."""
        read = functools.partial(self._directory.entry, tenant, attribute, value)
        return self._entries.get(tenant, (attribute, value), read)

    def managed(self, tenant: str, names: frozenset[str]) -> frozenset[str]:
        """Those of `names` the tenant's directory decides for, as of its current version:
        its groups' displayNames, and those its groups had before they were deleted or
        renamed (a name the directory ever managed stays its own to grant)."""
        if not names:
            return frozenset()  # nothing to ask
        read = functools.partial(self._directory.managed_among, tenant, names)
        return self._managed.get(tenant, names, read) or frozenset()

    def groups_for(self, claims: Mapping[str, Any], policy: Policy) -> DirectoryGroups | None:
        """What the directory says of the caller these claims name (`DirectoryGroups`: its
        groups, and the token's groups it withholds); None when the directory knows no such
        user; no groups held when they name only a former value of active users. 403
        `account_disabled` for an inactive user, or a token of a former holder of its name.
        The claims are not changed. Blocking: a request on the event loop asks `resolve`."""
        key = self._key(claims, policy)
        if key is None:
            tenant = _unnamed(claims, policy)
            if tenant is not None and tenant in self.versions.current():
                _refuse_unnamed(tenant, policy)
            return None
        found = self._decided(self.entry(*key), claims, key[0])
        if found is None:
            return None
        return _judged(found, self.managed(key[0], _token_groups(claims, policy)))

    async def resolve(self, claims: Mapping[str, Any], policy: Policy) -> DirectoryGroups | None:
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
        tenant, attribute, value = key
        cached = self._entries.peek(tenant, (attribute, value))
        if cached is _MISS:
            cached = await asyncio.to_thread(self.entry, *key)
        assert cached is None or isinstance(cached, Entry)
        found = self._decided(cached, claims, tenant)
        if found is None:
            return None
        listed = _token_groups(claims, policy)
        names = self._managed.peek(tenant, listed) if listed else frozenset()
        if names is _MISS:
            names = await asyncio.to_thread(self.managed, tenant, listed)
        assert names is None or isinstance(names, frozenset)
        return _judged(found, names or frozenset())

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
        # NFC, as the directory keeps names: "zoë" sent decomposed is the same user, so
        # her deactivation is enforced however her identity provider writes her name.
        return tenant, policy.directory.user_attribute, canonical_name(value)


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


def _token_groups(claims: Mapping[str, Any], policy: Policy) -> frozenset[str]:
    """The names in the token's `groups` claim, NFC as resolve_caller compares them (none
    unless it is a list)."""
    listed = claims.get(policy.claims.groups)
    if not isinstance(listed, list):
        return frozenset()
    return frozenset(canonical_name(g) for g in listed if isinstance(g, str))


def _judged(found: Entry, managed: frozenset[str]) -> DirectoryGroups:
    """The entry's groups, and the token groups it withholds: of those the directory
    manages (`managed`: its groups' displayNames, current or former, among the token's),
    each it does not hold this user in, for those the directory decides, so a membership
    SCIM removed, or a group deleted or renamed, is enforced before the token expires. A
    group the directory never had stays. For a former value of active users (granted
    none of their groups) the groups those users are in are the ones that may stay."""
    allowed = found.groups if found.kept is None else found.kept
    return DirectoryGroups(held=found.groups, withheld=managed.difference(allowed))
