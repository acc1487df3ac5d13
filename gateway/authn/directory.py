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
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Mapping
from typing import Any

from gateway.errors import GatewayError
from gateway.policy.model import Policy
from gateway.storage.directory import Directory, Entry
from gateway.storage.directory_versions import DirectoryVersions

CACHED_ENTRIES = 100_000  # a bound on memory; an evicted entry costs one query again
# Who was deprovisioned is a decision about a person, so the detail says no more than this.
DISABLED_DETAIL = "this account is disabled in the directory"


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

    def groups_for(self, claims: Mapping[str, Any], policy: Policy) -> tuple[str, ...] | None:
        """The directory groups of the caller these claims name; None when the directory
        knows no such user. 403 `account_disabled` for an inactive user."""
        tenant = claims.get(policy.claims.tenant)
        value = claims.get(policy.directory.user_claim)
        if not isinstance(tenant, str) or not isinstance(value, str) or not value:
            return None
        found = self.entry(tenant, policy.directory.user_attribute, value)
        if found is None:
            return None
        if not found.active:
            raise GatewayError("account_disabled", DISABLED_DETAIL)
        return found.groups
