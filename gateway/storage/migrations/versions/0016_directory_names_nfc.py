"""The directory's names in Unicode NFC: userNames (and their keys), externalIds and the
displayNames of groups, current and former.

Every door now compares names in NFC (gateway/domain.py, `canonical_name`): "zoë" sent
decomposed (NFD) by a token or an identity provider is the user "zoë". A name stored in
another form would match no token any more, so its deactivation would go unenforced; each
is written again in NFC, and each userName key that followed its userName (ASCII letters
folded) is computed again from it. A key that does not (a tombstone's name given up,
`RETIRED-...`) stays.

Two rows of a tenant whose keys become one, which the unique index held apart:
- with at most one of them live (not deleted), the live one keeps the name, as when a
  name is provisioned again after a delete (gateway/storage/directory.py, `_unique`): the
  others give their key up (a tombstone keeps refusing its user's tokens by id or
  externalId), and the live one's name is stamped as held before (`user_name_since`, now),
  so that a token issued before the upgrade, which may be the former holder's, is refused
  and its owner signs in again. With none live, the most recently changed one keeps it.
- two live users would be one person to every token from now on, and the gateway cannot
  know which one a token means: the upgrade is refused, naming the tenant and the users'
  IDs, and nothing is changed. Delete or rename one of them in the identity provider (its
  deletion leaves a tombstone, which the rule above handles) and upgrade again.

ACLs in the index keep their principals as written: a document whose ACL names someone in
another form than NFC must be sent again (CHANGELOG.md, "Migration notes").

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import datetime as dt
import unicodedata
import uuid
from collections import defaultdict
from typing import Any

import sqlalchemy as sa
from alembic import op

from gateway.errors import GatewayError

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_SHOWN = 20  # collisions named in the refusal; the rest counted

USERS = sa.table(
    "directory_users",
    sa.column("tenant", sa.String()),
    sa.column("id", sa.String()),
    sa.column("user_name", sa.String()),
    sa.column("user_name_key", sa.String()),
    sa.column("external_id", sa.String()),
    sa.column("deleted", sa.Boolean()),
    sa.column("modified", sa.DateTime(timezone=True)),
    sa.column("user_name_since", sa.DateTime(timezone=True)),
)
GROUPS = sa.table(
    "directory_groups",
    sa.column("tenant", sa.String()),
    sa.column("id", sa.String()),
    sa.column("display_name", sa.String()),
    sa.column("external_id", sa.String()),
)
RETIRED_GROUPS = sa.table(
    "directory_retired_groups",
    sa.column("tenant", sa.String()),
    sa.column("display_name", sa.String()),
)


def _nfc(value: str | None) -> str | None:
    return None if value is None else unicodedata.normalize("NFC", value)


def _nameless() -> str:
    return f"RETIRED-{uuid.uuid4().hex}"  # as gateway/storage/directory.py gives a name up


def upgrade() -> None:
    bind = op.get_bind()
    _users(bind)
    _groups(bind)
    _retired_groups(bind)


def _users(bind: sa.Connection) -> None:
    rows = bind.execute(sa.select(USERS)).all()
    wanted: dict[tuple[str, str], dict[str, Any]] = {}
    holders: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for row in rows:
        name = _nfc(row.user_name)
        assert name is not None
        follows = row.user_name_key == row.user_name.translate(_ASCII_LOWER)
        key = name.translate(_ASCII_LOWER) if follows else row.user_name_key
        values = {"user_name": name, "user_name_key": key, "external_id": _nfc(row.external_id)}
        wanted[(row.tenant, row.id)] = values
        holders[(row.tenant, key)].append(row)
    now, refused = dt.datetime.now(dt.UTC), []
    for (tenant, _), rows_of_key in holders.items():
        if len(rows_of_key) == 1:
            continue
        live = [r for r in rows_of_key if not r.deleted]
        if len(live) > 1:
            refused.append(f"tenant {tenant!r}: users {', '.join(sorted(r.id for r in live))}")
            continue
        keeper = live[0] if live else max(rows_of_key, key=lambda r: (r.modified, r.id))
        for row in rows_of_key:
            if row is not keeper:
                wanted[(tenant, row.id)]["user_name_key"] = _nameless()
        if live:
            wanted[(tenant, keeper.id)]["user_name_since"] = now
    if refused:
        more = f"; and {len(refused) - _SHOWN} more" if len(refused) > _SHOWN else ""
        raise GatewayError(
            "catalog_outdated",
            "directory users whose userNames are one name in Unicode NFC (as every door "
            "now compares names): " + "; ".join(refused[:_SHOWN]) + more + ". Delete or "
            "rename all but one of each in the identity provider (SCIM), then run `gateway "
            "db upgrade` again; nothing was changed",
        )
    changed = {
        (row.tenant, row.id): wanted[(row.tenant, row.id)]
        for row in rows
        if any(getattr(row, k) != v for k, v in wanted[(row.tenant, row.id)].items())
    }
    which = (USERS.c.tenant == sa.bindparam("t")) & (USERS.c.id == sa.bindparam("i"))
    # Keys that no row holds first, then the wanted ones: no key is held twice meanwhile.
    for tenant, user_id in changed:
        update = sa.update(USERS).where(which).values(user_name_key=_nameless())
        bind.execute(update, {"t": tenant, "i": user_id})
    for (tenant, user_id), values in changed.items():
        bind.execute(sa.update(USERS).where(which).values(values), {"t": tenant, "i": user_id})


def _groups(bind: sa.Connection) -> None:
    rows = bind.execute(sa.select(GROUPS)).all()
    which = (GROUPS.c.tenant == sa.bindparam("t")) & (GROUPS.c.id == sa.bindparam("i"))
    for row in rows:
        name, external = _nfc(row.display_name), _nfc(row.external_id)
        if (name, external) != (row.display_name, row.external_id):
            update = sa.update(GROUPS).where(which).values(display_name=name, external_id=external)
            bind.execute(update, {"t": row.tenant, "i": row.id})


def _retired_groups(bind: sa.Connection) -> None:
    """A former displayName in NFC, once: two forms of one name become one row."""
    rows = bind.execute(sa.select(RETIRED_GROUPS)).all()
    kept = {(r.tenant, r.display_name) for r in rows}
    for tenant, name in sorted(kept):
        canonical = _nfc(name)
        if canonical == name:
            continue
        bind.execute(
            sa.delete(RETIRED_GROUPS).where(
                RETIRED_GROUPS.c.tenant == tenant, RETIRED_GROUPS.c.display_name == name
            )
        )
        if (tenant, canonical) not in kept:
            bind.execute(sa.insert(RETIRED_GROUPS).values(tenant=tenant, display_name=canonical))
            kept.add((tenant, canonical))
