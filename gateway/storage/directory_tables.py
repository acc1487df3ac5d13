"""The directory's tables and values (gateway/storage/directory.py reads and writes them):
users, groups, memberships, the displayNames of groups deleted or renamed, and the version
counters of each tenant and the deployment."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    DateTime,
    Index,
    Integer,
    String,
    Table,
    delete,
    insert,
    select,
    update,
)
from sqlmodel import SQLModel

from gateway.domain import canonical_name

# The models' metadata: one description of the whole catalog, compared with the
# migrations' result by tests/test_schema.py.
_META = SQLModel.metadata
USERS = Table(
    "directory_users",
    _META,
    Column("tenant", String, primary_key=True),
    Column("id", String, primary_key=True),
    Column("user_name", String, nullable=False),
    Column("user_name_key", String, nullable=False),
    Column("external_id", String),
    Column("display_name", String),
    Column("active", Boolean, nullable=False),
    Column("deleted", Boolean, nullable=False),
    Column("attributes_json", String, nullable=False),
    Column("created", DateTime(timezone=True), nullable=False),
    Column("modified", DateTime(timezone=True), nullable=False),
    Column("revision", Integer, nullable=False),
    # When the row's userName (externalId) was given to it, where someone held that value
    # before; null for a first holder. A token issued earlier is the former holder's.
    Column("user_name_since", DateTime(timezone=True)),
    Column("external_id_since", DateTime(timezone=True)),
    Index("ux_directory_users_name", "tenant", "user_name_key", unique=True),
    Index("ix_directory_users_external", "tenant", "external_id"),
)
GROUPS = Table(
    "directory_groups",
    _META,
    Column("tenant", String, primary_key=True),
    Column("id", String, primary_key=True),
    Column("display_name", String, nullable=False),
    Column("external_id", String),
    Column("created", DateTime(timezone=True), nullable=False),
    Column("modified", DateTime(timezone=True), nullable=False),
    Column("revision", Integer, nullable=False),
    Index("ix_directory_groups_name", "tenant", "display_name"),
)
MEMBERS = Table(
    "directory_members",
    _META,
    Column("tenant", String, primary_key=True),
    Column("group_id", String, primary_key=True),
    Column("user_id", String, primary_key=True),
    Index("ix_directory_members_user", "tenant", "user_id"),
)
# The displayNames a tenant's groups had before they were deleted or renamed (compared as
# group displayNames are, exactly): a token group of such a name stays the directory's to
# decide (gateway/authn/directory.py, `managed`), so deleting or renaming a group does not
# hand its name back to the tokens that still list it.
RETIRED_GROUPS = Table(
    "directory_retired_groups",
    _META,
    Column("tenant", String, primary_key=True),
    Column("display_name", String, primary_key=True),
)
VERSIONS = Table(
    "directory_versions",
    _META,
    Column("tenant", String, primary_key=True),
    Column("version", Integer, nullable=False),
)
DEPLOYMENT = ""  # the tenant name of the deployment-wide counter
PART = 500  # IDs per statement: under every database's parameter limit
# userName is caseExact false for ASCII letters only: `str.lower()` also folds letters of
# other scripts onto ASCII (the Kelvin sign U+212A is "k"), which made "\u212aim" and "kim"
# one user, two identities an identity provider keeps apart.
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
FILTERABLE = {"userName": USERS.c.user_name_key, "externalId": USERS.c.external_id}
GROUP_FILTERABLE = {"displayName": GROUPS.c.display_name, "externalId": GROUPS.c.external_id}


# When the userName and the externalId were given to their holder, where someone held them
# before (`user_name_since`, `external_id_since`); None for a first holder.
Since = tuple[dt.datetime | None, dt.datetime | None]


class Conflict(Exception):
    """Another user of the tenant has this userName (SCIM 409 uniqueness)."""


class UnknownMembers(Exception):
    """Member IDs that are no user of the tenant."""

    def __init__(self, ids: Sequence[str]) -> None:
        super().__init__(", ".join(ids[:5]))
        self.ids = list(ids)


@dataclass(frozen=True)
class UserFields:
    user_name: str
    external_id: str | None = None
    display_name: str | None = None
    active: bool = True
    attributes: dict[str, Any] = field(default_factory=dict)  # the rest, kept as sent


@dataclass(frozen=True)
class DirUser:
    id: str
    fields: UserFields
    created: dt.datetime
    modified: dt.datetime
    revision: int
    groups: tuple[tuple[str, str], ...] = ()  # (group id, displayName)
    since: Since = (None, None)


@dataclass(frozen=True)
class DirGroup:
    id: str
    display_name: str
    external_id: str | None
    created: dt.datetime
    modified: dt.datetime
    revision: int
    members: tuple[tuple[str, str], ...] = ()  # (user id, userName)


@dataclass(frozen=True)
class Entry:
    """What identity needs of a directory user: whether it may act, and its groups."""

    active: bool
    groups: tuple[str, ...]
    # When the value the caller was matched by was given to this user, where someone held
    # it before (POSIX seconds): a token issued earlier is the former holder's.
    since: float | None = None
    # Matched only by a value its users no longer have (a former userName or externalId of
    # users still active): `groups` is empty, for such a token grants none of theirs, and
    # these are the groups every one of those users is in, which narrow the token's own:
    # a token group the directory manages counts only if it is here.
    kept: tuple[str, ...] | None = None


def name_key(user_name: str) -> str:
    """What userNames are compared by, stored and looked up alike: NFC, then ASCII letters
    folded. In that order, so that a name's key is its canonical form's: "JOSE\u0301"
    (decomposed) has the key of "JOSÉ", not that of "josé"."""
    return canonical_name(user_name).translate(_ASCII_LOWER)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def aware(moment: dt.datetime) -> dt.datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)  # SQLite drops it


def bump(c: Connection, tenant: str) -> int:
    """Raise the deployment's counter (locking its row until commit) and make it the
    tenant's version."""
    c.execute(
        update(VERSIONS)
        .where(VERSIONS.c.tenant == DEPLOYMENT)
        .values(version=VERSIONS.c.version + 1)
    )
    version = int(
        c.execute(select(VERSIONS.c.version).where(VERSIONS.c.tenant == DEPLOYMENT)).scalar_one()
    )
    changed = c.execute(update(VERSIONS).where(VERSIONS.c.tenant == tenant).values(version=version))
    if changed.rowcount == 0:
        c.execute(insert(VERSIONS).values(tenant=tenant, version=version))
    return version


def add_members(c: Connection, tenant: str, group_id: str, user_ids: Sequence[str]) -> None:
    rows = [{"tenant": tenant, "group_id": group_id, "user_id": u} for u in user_ids]
    for start in range(0, len(rows), PART):
        c.execute(insert(MEMBERS), rows[start : start + PART])


def user_values(
    tenant: str,
    user_id: str,
    fields: UserFields,
    created: dt.datetime,
    modified: dt.datetime,
    revision: int,
    since: Since = (None, None),
) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "id": user_id,
        "user_name": fields.user_name,
        "user_name_key": name_key(fields.user_name),
        "external_id": fields.external_id,
        "display_name": fields.display_name,
        "active": fields.active,
        "deleted": False,
        "attributes_json": json.dumps(fields.attributes),
        "created": created,
        "modified": modified,
        "revision": revision,
        "user_name_since": since[0],
        "external_id_since": since[1],
    }


def parts(ids: list[str]) -> Iterable[list[str]]:
    for start in range(0, len(ids), PART):
        yield ids[start : start + PART]


def delete_tenant_entries(c: Connection, tenant: str) -> tuple[int, int]:
    """Every user, group, membership and former group name of the tenant, under a new
    version (so that every replica drops what it cached of them on its next request):
    (that version, rows gone)."""
    version = bump(c, tenant)
    rows = sum(
        c.execute(delete(table).where(table.c.tenant == tenant)).rowcount
        for table in (MEMBERS, GROUPS, RETIRED_GROUPS, USERS)
    )
    return version, rows
