"""How the directory narrows a token's groups (gateway/authn/directory.py), on a real SQLite
catalog: without editing the claims it is given, asking the catalog about the token's own
groups only, and refusing a former value it cannot read whole."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gateway.authn.directory import DirectoryIdentity
from gateway.errors import GatewayError
from gateway.policy.model import Policy
from gateway.policy.resolve import DirectoryGroups, resolve_caller
from gateway.storage.catalog import Catalog
from gateway.storage.directory import MATCHES, RETIRED_FROM, UserFields
from gateway.storage.directory_tables import USERS


def test_resolution_leaves_the_claims_it_is_given_unchanged(tmp_path: Path) -> None:
    """The directory withholds a token group it manages and does not hold the user in, but
    by what it returns: a claims dict shared by several resolutions (a cache of verified
    tokens, a preview's subject) was narrowed for all of them when it was edited."""
    catalog = Catalog(tmp_path / "catalog.db")
    identity = DirectoryIdentity(catalog.directory, catalog.directory_versions)
    policy = Policy()
    bo, _ = catalog.directory.create_user("acme", UserFields("bo"))
    catalog.directory.create_group("acme", "risk", None, [])  # managed, bo not in it
    catalog.directory.create_group("acme", "hr", None, [bo.id])
    claims: dict[str, Any] = {"sub": "bo", "tenant": "acme", "region": "EU"}
    claims["groups"] = ["risk", "staff"]
    before = copy.deepcopy(claims)

    found = identity.groups_for(claims, policy)
    assert claims == before
    assert asyncio.run(identity.resolve(claims, policy)) == found
    assert claims == before
    assert found == DirectoryGroups(held=("hr",), withheld=frozenset({"risk"}))
    principals = resolve_caller(claims, policy, found).principals
    assert {"group:staff", "group:hr"} <= principals and "group:risk" not in principals
    # The same claims, resolved without a directory, still hold what the token lists.
    assert "group:risk" in resolve_caller(claims, policy).principals


def test_a_request_asks_the_catalog_about_its_token_groups_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every SCIM write raises the tenant's version; a request after it asks which of its
    token's groups the directory manages, by index, rather than reading every group name
    of the tenant again (one scan per request per write during a sync)."""
    path = tmp_path / "catalog.db"
    serving, writer = Catalog(path), Catalog(path)  # a second process writes
    identity = DirectoryIdentity(serving.directory, serving.directory_versions)
    policy = Policy()
    asked: list[frozenset[str]] = []
    among = serving.directory.managed_among

    def recorded(tenant: str, names: frozenset[str]) -> frozenset[str]:
        asked.append(names)
        return among(tenant, names)

    def every_name(tenant: str) -> set[str]:
        raise AssertionError("every group name of the tenant read for one request")

    monkeypatch.setattr(serving.directory, "managed_among", recorded)
    monkeypatch.setattr(serving.directory, "managed_names", every_name)
    bo, _ = writer.directory.create_user("acme", UserFields("bo"))
    risk, _ = writer.directory.create_group("acme", "risk", None, [])
    for n in range(50):
        writer.directory.create_group("acme", f"team-{n}", None, [bo.id])
    # More names than one statement takes (PART): the managed one comes last.
    listed = [f"other-{n:04}" for n in range(600)] + ["risk"]
    claims = {"sub": "bo", "tenant": "acme", "groups": listed}

    found = identity.groups_for(claims, policy)
    assert found is not None and found.withheld == {"risk"} and len(found.held) == 50
    assert asked == [frozenset(listed)]
    assert identity.groups_for(claims, policy) == found and len(asked) == 1  # cached
    writer.directory.change_group("acme", risk.id, "risk", None, [bo.id], [])
    found = identity.groups_for(claims, policy)
    assert found is not None and not found.withheld and "risk" in found.held
    assert len(asked) == 2
    asked.clear()
    assert identity.groups_for({"sub": "bo", "tenant": "acme"}, policy) == found
    assert asked == []  # no token groups: nothing to ask


def test_a_former_external_id_of_more_users_than_read_is_refused(tmp_path: Path) -> None:
    """A token naming an externalId users no longer have is refused while any of them is
    deactivated; with more such users than `entry` reads (MATCHES), one it did not read
    could be the deactivated one, so the token is refused rather than judged on a part."""
    catalog = Catalog(tmp_path / "catalog.db")
    directory = catalog.directory
    identity = DirectoryIdentity(directory, catalog.directory_versions)
    by_oid = Policy.model_validate(
        {"directory": {"user_claim": "oid", "user_attribute": "externalId"}}
    )
    for n in range(MATCHES + 1):
        user, _ = directory.create_user("acme", UserFields(f"u{n}", external_id="shared"))
        directory.replace_user("acme", user.id, UserFields(f"u{n}", external_id=f"own-{n}"))
    # The former value's row `entry` reads last, as it orders them: its user deactivated.
    with catalog.engine.connect() as c:
        rows = c.execute(
            select(USERS.c.attributes_json)
            .where(USERS.c.tenant == "acme", USERS.c.external_id == "shared")
            .order_by(USERS.c.deleted, USERS.c.id)
        ).all()
    assert len(rows) == MATCHES + 1
    holder = json.loads(rows[-1].attributes_json)[RETIRED_FROM]
    held = directory.user("acme", holder)
    assert held is not None
    directory.replace_user("acme", holder, dataclasses.replace(held.fields, active=False))

    with pytest.raises(GatewayError) as refused:
        identity.groups_for({"sub": "x", "tenant": "acme", "oid": "shared"}, by_oid)
    assert refused.value.code == "account_disabled"
