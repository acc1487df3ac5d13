"""The directory in the catalog: users, groups and memberships that an identity provider
provisions by SCIM (gateway/api/scim.py), per tenant, and the version counters that tell
every serving process a change happened.

Every write runs in one transaction that first raises the deployment's counter (the row
of tenant '' in `directory_versions`; its lock orders concurrent writers on PostgreSQL)
and then records that number as the tenant's version: a process that saw the tenant's
version holds everything written up to it. A write checks everything before it changes
anything, so a refused request changes nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, insert, select, update

from gateway.domain import canonical_name
from gateway.storage.directory_tables import (
    DEPLOYMENT,
    FILTERABLE,
    GROUP_FILTERABLE,
    GROUPS,
    MEMBERS,
    RETIRED_GROUPS,
    USERS,
    VERSIONS,
    Conflict,
    DirGroup,
    DirUser,
    Entry,
    UnknownMembers,
    UserFields,
    add_members,
    aware,
    bump,
    delete_tenant_entries,
    name_key,
    parts,
    user_values,
    utc_now,
)

# What callers import from here (the tables module holds them).
__all__ = [
    "DEPLOYMENT",
    "Conflict",
    "DirGroup",
    "DirUser",
    "Directory",
    "Entry",
    "GroupChange",
    "UnknownMembers",
    "UserFields",
]

MATCHES = 100  # rows of one value (users, tombstones, former values) `entry` reads; more: refused
# A user's former userName or externalId is kept in a row of its own, a tombstone marked
# by revision 0 (a user's rows start at 1) that names the user it was retired from. A
# token that names only such a value is refused once that user is deactivated or deleted;
# without it a user renamed (or whose externalId changed) as it was deprovisioned became
# a caller the directory does not know, passed with the token's own groups. While the user
# is active, the token's groups are narrowed by that user's memberships (Entry.kept). It
# never grants that user's groups, and a current user holding the value decides alone.
RETIRED = 0
RETIRED_FROM = "retired_from"
# A value given to a user that someone held before (a tombstone's, or one retired from
# another user) is stamped with the moment (`user_name_since`, `external_id_since`): a
# token issued earlier is the former holder's, and identity refuses it (Entry.since), so a
# recycled userName does not hand the old holder's tokens to the new user. A value no one
# held before is not stamped: a user provisioned after its first sign-in keeps working.
GroupChange = tuple[str, str | None, list[str]]  # displayName, externalId, member IDs


class Directory:
    """Reads and writes of one catalog's directory; a deleted user is kept as a tombstone
    (inactive, no groups) that no read but `entry` returns."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- reads ---------------------------------------------------------------------------

    def versions(self) -> dict[str, int]:
        """Every tenant's version, and the deployment's under ''."""
        with self.engine.connect() as c:
            return {t: v for t, v in c.execute(select(VERSIONS.c.tenant, VERSIONS.c.version))}

    def entry(self, tenant: str, attribute: str, value: str) -> Entry | None:
        """The directory user whose `attribute` (userName, externalId or id) is `value`.

        Only userName is unique: two live users may share an externalId. Then the caller is
        refused if any of them is inactive, and otherwise holds only the groups all of them
        share, so an ambiguous match never grants more than each user has. `since` is when
        the value was given to its holder (the latest of them), where someone held it before.
        Values are compared in NFC (`canonical_name`), the form SCIM stores them in."""
        column = {"userName": USERS.c.user_name_key, "externalId": USERS.c.external_id}.get(
            attribute, USERS.c.id
        )
        stamp = {"userName": "user_name_since", "externalId": "external_id_since"}.get(attribute)
        wanted = name_key(value) if attribute == "userName" else canonical_name(value)
        with self.engine.connect() as c:
            rows = c.execute(
                select(
                    USERS.c.id,
                    USERS.c.active,
                    USERS.c.deleted,
                    USERS.c.revision,
                    USERS.c.attributes_json,
                    USERS.c.user_name_since,
                    USERS.c.external_id_since,
                )
                .where(USERS.c.tenant == tenant, column == wanted)
                .order_by(USERS.c.deleted, USERS.c.id)
                .limit(MATCHES)
            ).all()
            if len(rows) >= MATCHES:
                # Some rows went unread, a deactivated former holder's among them maybe:
                # refused rather than judged on a part, for current and former values alike.
                return Entry(False, ())
            current = [r for r in rows if r.revision != RETIRED]
            if not current:  # only values users no longer have, or nothing
                return _former_holders(c, tenant, rows)
            live = [r for r in current if not r.deleted]
            if not live or not all(r.active for r in live):
                return Entry(False, ())  # a tombstone only, or someone deactivated
            held = _shared_groups(c, tenant, [r.id for r in live])
            stamps = [getattr(r, stamp) for r in live] if stamp else []
            since = max((aware(s).timestamp() for s in stamps if s is not None), default=None)
            return Entry(True, held, since)

    def group_names(self, tenant: str | None) -> list[str]:
        """The displayNames of a tenant's groups (None: of every tenant's)."""
        query = select(GROUPS.c.display_name).distinct()
        if tenant is not None:
            query = query.where(GROUPS.c.tenant == tenant)
        with self.engine.connect() as c:
            return sorted(c.execute(query).scalars())

    def managed_names(self, tenant: str) -> set[str]:
        """The displayNames the tenant's directory decides for in a token's groups: those
        of its groups, and those its groups had before they were deleted or renamed."""
        current = select(GROUPS.c.display_name).where(GROUPS.c.tenant == tenant)
        retired = select(RETIRED_GROUPS.c.display_name).where(RETIRED_GROUPS.c.tenant == tenant)
        with self.engine.connect() as c:
            return set(c.execute(current).scalars()) | set(c.execute(retired).scalars())

    def managed_among(self, tenant: str, names: Iterable[str]) -> frozenset[str]:
        """Those of `names` that `managed_names` holds, looked up by index: a request asks
        about its token's groups, not every name a tenant's directory has."""
        found: set[str] = set()
        with self.engine.connect() as c:
            for part in parts(sorted({canonical_name(n) for n in names})):
                for table in (GROUPS, RETIRED_GROUPS):
                    named = table.c.display_name.in_(part)
                    query = select(table.c.display_name).where(table.c.tenant == tenant, named)
                    found.update(c.execute(query).scalars())
        return frozenset(found)

    def user(self, tenant: str, user_id: str) -> DirUser | None:
        with self.engine.connect() as c:
            found = self._users(c, tenant, USERS.c.id == user_id, 0, 1)
            return found[0] if found else None

    def users(
        self, tenant: str, where: tuple[str, str] | None, start: int, count: int
    ) -> tuple[int, list[DirUser]]:
        """(total matching, the page from `start`, 0-based); `where` is (attribute, value)."""
        condition = (USERS.c.tenant == tenant) & ~USERS.c.deleted
        if where is not None:
            attribute, value = where
            wanted = name_key(value) if attribute == "userName" else canonical_name(value)
            condition = condition & (FILTERABLE[attribute] == wanted)
        with self.engine.connect() as c:
            total = c.execute(select(func.count()).select_from(USERS).where(condition)).scalar()
            return int(total or 0), self._users(c, tenant, condition, start, count)

    def group(self, tenant: str, group_id: str, members: bool = True) -> DirGroup | None:
        with self.engine.connect() as c:
            found = self._groups(c, tenant, GROUPS.c.id == group_id, 0, 1, members)
            return found[0] if found else None

    def groups(
        self,
        tenant: str,
        where: tuple[str, str] | None,
        start: int,
        count: int,
        members: bool = True,
    ) -> tuple[int, list[DirGroup]]:
        condition = GROUPS.c.tenant == tenant
        if where is not None:
            condition = condition & (GROUP_FILTERABLE[where[0]] == canonical_name(where[1]))
        with self.engine.connect() as c:
            total = c.execute(select(func.count()).select_from(GROUPS).where(condition)).scalar()
            return int(total or 0), self._groups(c, tenant, condition, start, count, members)

    def _users(
        self, c: Connection, tenant: str, condition: Any, start: int, count: int
    ) -> list[DirUser]:
        query = select(USERS).where(USERS.c.tenant == tenant, condition, ~USERS.c.deleted)
        query = query.order_by(USERS.c.id)
        rows = c.execute(query.offset(start).limit(count)).all()
        held: dict[str, list[tuple[str, str]]] = {r.id: [] for r in rows}
        for part in parts(list(held)):
            joined = (
                select(MEMBERS.c.user_id, GROUPS.c.id, GROUPS.c.display_name)
                .join(
                    GROUPS,
                    (MEMBERS.c.tenant == GROUPS.c.tenant) & (MEMBERS.c.group_id == GROUPS.c.id),
                )
                .where(MEMBERS.c.tenant == tenant, MEMBERS.c.user_id.in_(part))
            )
            for user_id, group_id, name in c.execute(joined):
                held[user_id].append((group_id, name))
        return [
            DirUser(
                r.id,
                UserFields(
                    r.user_name,
                    r.external_id,
                    r.display_name,
                    bool(r.active),
                    json.loads(r.attributes_json),
                ),
                aware(r.created),
                aware(r.modified),
                r.revision,
                tuple(sorted(held[r.id])),
                (_aware(r.user_name_since), _aware(r.external_id_since)),
            )
            for r in rows
        ]

    def _groups(
        self, c: Connection, tenant: str, condition: Any, start: int, count: int, members: bool
    ) -> list[DirGroup]:
        query = select(GROUPS).where(GROUPS.c.tenant == tenant, condition).order_by(GROUPS.c.id)
        rows = c.execute(query.offset(start).limit(count)).all()
        held: dict[str, list[tuple[str, str]]] = {r.id: [] for r in rows}
        for part in parts(list(held) if members else []):
            joined = (
                select(MEMBERS.c.group_id, USERS.c.id, USERS.c.user_name)
                .join(
                    USERS, (MEMBERS.c.tenant == USERS.c.tenant) & (MEMBERS.c.user_id == USERS.c.id)
                )
                .where(MEMBERS.c.tenant == tenant, MEMBERS.c.group_id.in_(part))
            )
            for group_id, user_id, name in c.execute(joined):
                held[group_id].append((user_id, name))
        return [
            DirGroup(
                r.id,
                r.display_name,
                r.external_id,
                aware(r.created),
                aware(r.modified),
                r.revision,
                tuple(sorted(held[r.id])),
            )
            for r in rows
        ]

    # -- writes: each returns what it wrote and the deployment's new version ---------------

    def create_user(self, tenant: str, fields: UserFields) -> tuple[DirUser, int]:
        user_id, now = uuid.uuid4().hex, utc_now()
        with self.engine.begin() as c:
            version = bump(c, tenant)
            since = (
                self._unique(c, tenant, fields.user_name, None, now),
                _external_since(c, tenant, fields.external_id, None, now),
            )
            values = user_values(tenant, user_id, fields, now, now, 1, since)
            c.execute(insert(USERS).values(values))
        return DirUser(user_id, fields, now, now, 1, since=since), version

    def replace_user(
        self, tenant: str, user_id: str, fields: UserFields
    ) -> tuple[DirUser | None, int]:
        _, user, version = self.update_user(tenant, user_id, lambda _old: fields)
        return user, version

    def update_user(
        self, tenant: str, user_id: str, change: Callable[[DirUser], UserFields]
    ) -> tuple[DirUser | None, DirUser | None, int]:
        """(before, after, version): `change` computes the new fields from the user as read
        inside the write transaction, after the version bump has serialised writers, so
        two concurrent PATCHes each apply to the other's result (a deactivation is never
        written back as active from a stale read). An exception from `change` writes
        nothing."""
        now = utc_now()
        with self.engine.begin() as c:
            version = bump(c, tenant)
            found = self._users(c, tenant, USERS.c.id == user_id, 0, 1)
            if not found:
                return None, None, version
            old = found[0]
            fields = change(old)
            # A value kept keeps its stamp; one taken is stamped by whoever held it before.
            name_since, external_since = old.since
            if name_key(fields.user_name) != name_key(old.fields.user_name):
                name_since = self._unique(c, tenant, fields.user_name, user_id, now)
            if fields.external_id != old.fields.external_id:
                external_since = _external_since(c, tenant, fields.external_id, user_id, now)
            since = (name_since, external_since)
            revision = old.revision + 1
            values = user_values(tenant, user_id, fields, old.created, now, revision, since)
            c.execute(
                update(USERS).where(USERS.c.tenant == tenant, USERS.c.id == user_id).values(values)
            )
            _retire(c, tenant, user_id, old, fields, now)
            new = self._users(c, tenant, USERS.c.id == user_id, 0, 1)[0]
        return old, new, version

    def delete_user(self, tenant: str, user_id: str) -> tuple[bool, int]:
        with self.engine.begin() as c:
            version = bump(c, tenant)
            held = delete(MEMBERS).where(MEMBERS.c.tenant == tenant, MEMBERS.c.user_id == user_id)
            c.execute(held)
            gone = c.execute(
                update(USERS)
                .where(USERS.c.tenant == tenant, USERS.c.id == user_id, ~USERS.c.deleted)
                .values(deleted=True, active=False, modified=utc_now())
            )
            return gone.rowcount > 0, version

    def create_group(
        self, tenant: str, display_name: str, external_id: str | None, members: Iterable[str]
    ) -> tuple[DirGroup, int]:
        group_id, now = uuid.uuid4().hex, utc_now()
        wanted = sorted(set(members))
        with self.engine.begin() as c:
            version = bump(c, tenant)
            self._known_users(c, tenant, wanted)
            c.execute(
                insert(GROUPS).values(
                    tenant=tenant,
                    id=group_id,
                    display_name=display_name,
                    external_id=external_id,
                    created=now,
                    modified=now,
                    revision=1,
                )
            )
            add_members(c, tenant, group_id, wanted)
        found = self.group(tenant, group_id)
        assert found is not None
        return found, version

    def change_group(
        self,
        tenant: str,
        group_id: str,
        display_name: str,
        external_id: str | None,
        add: Iterable[str],
        remove: Iterable[str],
    ) -> tuple[DirGroup | None, int]:
        """Rename and add and remove members."""
        adding, removing = set(add), set(remove)

        def change(old: DirGroup) -> GroupChange:
            now = {u for u, _ in old.members}
            return display_name, external_id, sorted((now | adding) - removing)

        _, group, version = self.update_group(tenant, group_id, change)
        return group, version

    def update_group(
        self, tenant: str, group_id: str, change: Callable[[DirGroup], GroupChange]
    ) -> tuple[DirGroup | None, DirGroup | None, int]:
        """(before, after, version): `change` computes (displayName, externalId, members)
        from the group as read inside the write transaction, after the version bump has
        serialised writers, so members added or removed by a concurrent request are not
        undone by a stale read. An exception from `change` writes nothing."""
        with self.engine.begin() as c:
            version = bump(c, tenant)
            found = self._groups(c, tenant, GROUPS.c.id == group_id, 0, 1, True)
            if not found:
                return None, None, version
            old = found[0]
            display_name, external_id, members = change(old)
            before, after = {u for u, _ in old.members}, set(members)
            self._known_users(c, tenant, sorted(after - before))
            if display_name != old.display_name:
                _retire_group_name(c, tenant, old.display_name)
            c.execute(
                update(GROUPS)
                .where(GROUPS.c.tenant == tenant, GROUPS.c.id == group_id)
                .values(
                    display_name=display_name,
                    external_id=external_id,
                    modified=utc_now(),
                    revision=old.revision + 1,
                )
            )
            for part in parts(sorted(before - after)):
                c.execute(
                    delete(MEMBERS).where(
                        MEMBERS.c.tenant == tenant,
                        MEMBERS.c.group_id == group_id,
                        MEMBERS.c.user_id.in_(part),
                    )
                )
            add_members(c, tenant, group_id, sorted(after - before))
            new = self._groups(c, tenant, GROUPS.c.id == group_id, 0, 1, True)[0]
        return old, new, version

    def member_ids(self, tenant: str, group_id: str) -> list[str]:
        with self.engine.connect() as c:
            return self._member_ids(c, tenant, group_id)

    def delete_group(self, tenant: str, group_id: str) -> tuple[bool, int]:
        with self.engine.begin() as c:
            version = bump(c, tenant)
            which = (GROUPS.c.tenant == tenant) & (GROUPS.c.id == group_id)
            for name in c.execute(select(GROUPS.c.display_name).where(which)).scalars().all():
                _retire_group_name(c, tenant, name)
            c.execute(
                delete(MEMBERS).where(MEMBERS.c.tenant == tenant, MEMBERS.c.group_id == group_id)
            )
            gone = c.execute(delete(GROUPS).where(which))
            return gone.rowcount > 0, version

    def delete_tenant(self, tenant: str) -> int:
        """Every user, group, membership and former group name of the tenant: the
        deployment's new version."""
        with self.engine.begin() as c:
            return delete_tenant_entries(c, tenant)[0]

    @staticmethod
    def _member_ids(c: Connection, tenant: str, group_id: str) -> list[str]:
        query = select(MEMBERS.c.user_id).where(
            MEMBERS.c.tenant == tenant, MEMBERS.c.group_id == group_id
        )
        return list(c.execute(query).scalars())

    @staticmethod
    def _unique(
        c: Connection, tenant: str, user_name: str, other_than: str | None, now: dt.datetime
    ) -> dt.datetime | None:
        """Conflict if another user has this userName; else the name's stamp for its new
        holder (`user_name_since`): `now` when someone held it before, the stamp it had if
        it was `other_than`'s own (a name taken back), None when no one had it."""
        query = select(
            USERS.c.id,
            USERS.c.deleted,
            USERS.c.external_id,
            USERS.c.revision,
            USERS.c.attributes_json,
            USERS.c.user_name_since,
        ).where(USERS.c.tenant == tenant, USERS.c.user_name_key == name_key(user_name))
        holder = c.execute(query).first()
        if holder is None or holder.id == other_than:
            return None
        if not holder.deleted:
            raise Conflict(user_name)
        own = other_than is not None and _retired_from(holder) == other_than
        since = _aware(holder.user_name_since) if own else now
        # Provisioned again after a delete: the new user takes the name from the tombstone,
        # which keeps refusing the old user's tokens (by its id or externalId) under a name
        # no one can hold. Only a former userName kept alone (`RETIRED`, no externalId) goes:
        # no token names its id, and the new holder's stamp refuses the name's old tokens.
        which = (USERS.c.tenant == tenant) & (USERS.c.id == holder.id)
        if holder.revision == RETIRED and holder.external_id is None:
            c.execute(delete(USERS).where(which))
        else:
            c.execute(update(USERS).where(which).values(user_name_key=_nameless()))
        return since

    @staticmethod
    def _known_users(c: Connection, tenant: str, ids: Sequence[str]) -> None:
        found: set[str] = set()
        for part in parts(list(ids)):
            query = select(USERS.c.id).where(
                USERS.c.tenant == tenant, USERS.c.id.in_(part), ~USERS.c.deleted
            )
            found.update(c.execute(query).scalars())
        unknown = [i for i in ids if i not in found]
        if unknown:
            raise UnknownMembers(unknown)


def _nameless() -> str:
    """A userName key no user can hold: keys have no ASCII capitals, this one has."""
    return f"RETIRED-{uuid.uuid4().hex}"


def _aware(moment: dt.datetime | None) -> dt.datetime | None:
    return None if moment is None else aware(moment)


def _retired_from(row: Any) -> str | None:
    """The user a `RETIRED` row kept a value of; None for any other row."""
    if row.revision != RETIRED:
        return None
    found = json.loads(row.attributes_json).get(RETIRED_FROM)
    return found if isinstance(found, str) else None


def _external_since(
    c: Connection, tenant: str, external_id: str | None, user_id: str | None, now: dt.datetime
) -> dt.datetime | None:
    """The stamp of an externalId given to `user_id` (None: a user being created): `now`
    when a deleted user or another user's former value held it, the stamp it had when it
    is the user's own former value taken back, None when no one held it. Users that share
    it now are not former holders: they stand beside this one (`entry`)."""
    if external_id is None:
        return None
    rows = c.execute(
        select(USERS.c.revision, USERS.c.attributes_json, USERS.c.external_id_since)
        .where(USERS.c.tenant == tenant, USERS.c.external_id == external_id, USERS.c.deleted)
        .limit(MATCHES)
    ).all()
    if not rows:
        return None
    if user_id is not None and all(_retired_from(r) == user_id for r in rows):
        return _aware(rows[0].external_id_since)  # its own, kept once (`_retire`)
    return now


def _retire(
    c: Connection, tenant: str, user_id: str, old: DirUser, new: UserFields, now: Any
) -> None:
    """Keep the userName and externalId the user no longer has (`RETIRED`), once each:
    a value it takes back, or had retired already, leaves no second row. Each keeps its
    stamp, which the user gets back with the value (`_unique`, `_external_since`)."""
    link = json.dumps({RETIRED_FROM: user_id})
    mine = (USERS.c.tenant == tenant) & (USERS.c.revision == RETIRED)
    mine = mine & (USERS.c.attributes_json == link)
    if new.external_id is not None:  # taken back, or retired before: this row goes
        c.execute(delete(USERS).where(mine, USERS.c.external_id == new.external_id))
    renamed = name_key(old.fields.user_name) != name_key(new.user_name)
    external = old.fields.external_id if old.fields.external_id != new.external_id else None
    if external is not None:
        c.execute(delete(USERS).where(mine, USERS.c.external_id == external))
    if not renamed and external is None:
        return
    name = old.fields.user_name if renamed else _nameless()
    retired = UserFields(name, external, None, False, {RETIRED_FROM: user_id})
    since = (old.since[0] if renamed else None, old.since[1] if external is not None else None)
    values = user_values(tenant, uuid.uuid4().hex, retired, now, now, RETIRED, since)
    key = values["user_name_key"] if renamed else name  # a nameless key stays upper case
    c.execute(insert(USERS).values({**values, "user_name_key": key, "deleted": True}))


def _former_holders(c: Connection, tenant: str, rows: Sequence[Any]) -> Entry | None:
    """A value only users who no longer have it had (None: no one had it): refused if one
    of them is now deactivated or deleted (its token is still that person's). Otherwise it
    grants none of their groups (the identity provider may have given the value to someone
    else), but narrows the token's: a token group the directory manages counts only if
    every one of them is in it (`kept`), as it would under their current value."""
    holders: list[str] = []
    for row in rows:
        user_id = json.loads(row.attributes_json).get(RETIRED_FROM)
        holder = c.execute(
            select(USERS.c.active, USERS.c.deleted).where(
                USERS.c.tenant == tenant, USERS.c.id == user_id
            )
        ).first()
        if holder is None or holder.deleted or not holder.active:
            return Entry(False, ())
        if user_id not in holders:
            holders.append(user_id)
    if not holders:
        return None
    return Entry(True, (), kept=_shared_groups(c, tenant, holders))


def _shared_groups(c: Connection, tenant: str, user_ids: Sequence[str]) -> tuple[str, ...]:
    """The displayNames of the groups that hold every one of these users, sorted."""
    held: set[str] | None = None
    for user_id in user_ids:
        names = set(
            c.execute(
                select(GROUPS.c.display_name)
                .join(
                    MEMBERS,
                    (MEMBERS.c.tenant == GROUPS.c.tenant) & (MEMBERS.c.group_id == GROUPS.c.id),
                )
                .where(MEMBERS.c.tenant == tenant, MEMBERS.c.user_id == user_id)
            ).scalars()
        )
        held = names if held is None else held & names
    return tuple(sorted(held or ()))


def _retire_group_name(c: Connection, tenant: str, display_name: str) -> None:
    """Keep a displayName a group of the tenant no longer has, once: a token group of that
    name stays the directory's to decide (`managed_names`)."""
    c.execute(
        delete(RETIRED_GROUPS).where(
            RETIRED_GROUPS.c.tenant == tenant, RETIRED_GROUPS.c.display_name == display_name
        )
    )
    c.execute(insert(RETIRED_GROUPS).values(tenant=tenant, display_name=display_name))
