"""The directory in the catalog, on SQLite and PostgreSQL: migration 0009 upgrades a
catalog at 0008 in place (a serving replica's row included), users and groups are kept per
tenant, a deleted user stays a tombstone that identity refuses, and every change raises
the version that requests check, so the next one sees it."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gateway.authn.directory import DirectoryIdentity
from gateway.errors import GatewayError
from gateway.policy.model import Policy
from gateway.policy.resolve import DirectoryGroups
from gateway.storage import schema
from gateway.storage.catalog import Catalog, open_engine
from gateway.storage.directory import MATCHES, Conflict, Entry, UnknownMembers, UserFields
from gateway.storage.layout import DataLayout
from gateway.storage.tenant_rows import remove_tenant_directory
from tests.helpers.postgres import Cluster


def upgraded(url: str, root: Path) -> Catalog:
    """A catalog at 0008 with a replica registered, upgraded to the newest revision."""
    engine = open_engine(url)
    schema.upgrade(engine, "0008")
    with engine.begin() as connection:
        connection.exec_driver_sql(
            "INSERT INTO replicas (replica_id, label, served_generation, seen_at) "
            "VALUES ('r1', 'host:1', 3, '2020-01-01 00:00:00')"  # long gone
        )
    before, after = schema.upgrade(engine)
    assert (before, after) == ("0008", schema.head())
    catalog = DataLayout(root, url).open_catalog()
    with engine.connect() as connection:
        kept = connection.exec_driver_sql(
            "SELECT served_generation, directory_version FROM replicas"
        )
        assert list(kept) == [(3, 0)]
    return catalog


def check_directory(catalog: Catalog) -> None:
    directory = catalog.directory
    assert directory.versions() == {"": 0}
    ann, v1 = directory.create_user("acme", UserFields("Ann", external_id="e1"))
    other, _ = directory.create_user("globex", UserFields("ann"))  # another tenant's Ann
    with pytest.raises(Conflict):
        directory.create_user("acme", UserFields("ANN"))
    staff, v2 = directory.create_group("acme", "staff", None, [ann.id])
    assert v2 > v1
    with pytest.raises(UnknownMembers):
        directory.create_group("acme", "stolen", None, [other.id])
    assert directory.group_names("acme") == ["staff"]
    assert directory.entry("acme", "userName", "ann") == Entry(True, ("staff",))
    assert directory.entry("acme", "externalId", "e1") == Entry(True, ("staff",))
    assert directory.entry("globex", "userName", "ann") == Entry(True, ())
    assert directory.users("acme", ("userName", "aNN"), 0, 10)[0] == 1
    assert directory.user("globex", ann.id) is None
    changed, v3 = directory.change_group("acme", staff.id, "staff-eu", "x", [], [ann.id])
    assert changed is not None and changed.members == () and v3 > v2
    assert directory.entry("acme", "userName", "Ann") == Entry(True, ())
    gone, _ = directory.delete_user("acme", ann.id)
    assert gone and directory.user("acme", ann.id) is None
    assert directory.entry("acme", "userName", "ann") == Entry(False, ())  # the tombstone
    assert directory.users("acme", None, 0, 10) == (0, [])
    again, _ = directory.create_user("acme", UserFields("ann"))  # provisioned again
    assert recycled(directory.entry("acme", "userName", "ann")) == Entry(True, ())
    assert again.id != ann.id
    versions = directory.versions()
    assert versions["acme"] == versions[""] > versions["globex"]
    check_former_identifiers(catalog)
    check_former_group_names(catalog)
    assert remove_tenant_directory(catalog.engine, "acme") > 0  # `gateway tenant delete`
    assert directory.users("acme", None, 0, 10)[0] == 0 and directory.group_names("acme") == []
    assert directory.managed_names("acme") == set()
    assert directory.managed_names("globex") == {"g-retired"}  # another tenant's stay


def recycled(entry: Entry | None) -> Entry:
    """An entry whose value someone held before: stamped with when it was given (recently)."""
    assert entry is not None and entry.since is not None, entry
    assert abs(entry.since - time.time()) < 60, entry
    return replace(entry, since=None)


def check_former_identifiers(catalog: Catalog) -> None:
    """A token issued under a userName or externalId the user no longer has is refused
    once that user is deactivated or deleted, never a caller the directory does not know
    (who would pass with the token's own groups). It never gets that user's groups (the
    identity provider may have given the value to someone else), and a current holder of
    the value decides alone."""
    directory = catalog.directory

    def changed(user_id: str, **fields: Any) -> None:
        directory.update_user("acme", user_id, lambda old: replace(old.fields, **fields))

    kim, _ = directory.create_user("acme", UserFields("kim", external_id="oid-1"))
    directory.create_group("acme", "payroll", None, [kim.id])
    changed(kim.id, user_name="kim.leaver")  # renamed while active
    # Not kim.leaver's groups; they only narrow the token's (a token group the directory
    # manages counts only if kim.leaver is in it).
    assert directory.entry("acme", "userName", "kim") == Entry(True, (), kept=("payroll",))
    changed(kim.id, active=False)
    assert directory.entry("acme", "userName", "kim") == Entry(False, ())
    changed(kim.id, user_name="kim.gone", external_id=None, active=False)
    assert directory.entry("acme", "externalId", "oid-1") == Entry(False, ())
    directory.delete_user("acme", kim.id)
    for name in ("kim", "kim.leaver", "kim.gone"):
        assert directory.entry("acme", "userName", name) == Entry(False, ())

    lee, _ = directory.create_user("acme", UserFields("lee", external_id="oid-2"))
    directory.delete_user("acme", lee.id)
    again, _ = directory.create_user("acme", UserFields("lee", external_id="oid-3"))
    assert directory.entry("acme", "externalId", "oid-2") == Entry(False, ())  # the one gone
    assert recycled(directory.entry("acme", "userName", "lee")) == Entry(True, ())  # reused
    assert directory.entry("acme", "externalId", "oid-3") == Entry(True, ())  # no one's before
    reused, _ = directory.create_user("acme", UserFields("kim"))  # a new kim takes the name
    assert recycled(directory.entry("acme", "userName", "kim")) == Entry(True, ())
    assert directory.users("acme", ("userName", "kim"), 0, 10)[1][0].id == reused.id
    listed = {u.fields.user_name for u in directory.users("acme", None, 0, 100)[1]}
    assert listed == {"ann", "lee", "kim"}  # no former identifier is a user SCIM lists

    # An externalId moved on and taken back, again and again, leaves at most one row, and
    # taken back it is the user's own again: not stamped as someone else's before.
    max_, _ = directory.create_user("acme", UserFields("max", external_id="mx-1"))
    for _ in range(MATCHES + 5):
        changed(max_.id, external_id="mx-2")
        changed(max_.id, external_id="mx-1")
    assert directory.entry("acme", "externalId", "mx-1") == Entry(True, ())
    # Its next holder decides alone, even once the former one is deactivated; tokens
    # issued before it was given the value are the former holder's (stamped).
    changed(max_.id, external_id="mx-3", active=False)
    assert directory.entry("acme", "externalId", "mx-1") == Entry(False, ())
    directory.create_user("acme", UserFields("nia", external_id="mx-1"))
    assert recycled(directory.entry("acme", "externalId", "mx-1")) == Entry(True, ())


def check_former_group_names(catalog: Catalog) -> None:
    """A group's displayName stays managed once the group is deleted or renamed, case kept
    as displayNames are compared; a token naming a renamed user's former userName keeps a
    managed token group only while that user is in it, and gains none of its groups."""
    directory = catalog.directory
    identity = DirectoryIdentity(directory, catalog.directory_versions)
    policy = Policy()

    def narrowed(sub: str, listed: list[str]) -> tuple[tuple[str, ...] | None, list[str]]:
        catalog.directory_versions.forget()  # with PostgreSQL: poll, as after a write here
        claims: dict[str, Any] = {"sub": sub, "tenant": "acme", "groups": listed}
        found = identity.groups_for(claims, policy)
        kept = [g for g in listed if found is None or g not in found.withheld]
        return (None if found is None else found.held), kept

    ola, _ = directory.create_user("acme", UserFields("ola"))
    audit, _ = directory.create_group("acme", "Audit", None, [ola.id])
    legal, _ = directory.create_group("acme", "legal", None, [])
    assert narrowed("ola", ["Audit", "audit", "legal"]) == (("Audit",), ["Audit", "audit"])
    directory.change_group("acme", audit.id, "audit-eu", None, [], [])
    directory.delete_group("acme", legal.id)
    directory.delete_group("acme", legal.id)  # gone already: nothing more kept
    assert {"Audit", "legal"} <= directory.managed_names("acme")
    assert "audit" not in directory.managed_names("acme")  # compared exactly, as current
    assert narrowed("ola", ["Audit", "audit", "legal"]) == (("audit-eu",), ["audit"])
    again, _ = directory.create_group("acme", "legal", None, [ola.id])  # current again
    assert narrowed("ola", ["legal"]) == (("audit-eu", "legal"), ["legal"])
    directory.delete_group("acme", again.id)  # retired a second time: no duplicate row
    assert narrowed("ola", ["legal"]) == (("audit-eu",), [])
    elsewhere, _ = directory.create_group("globex", "g-retired", None, [])
    directory.delete_group("globex", elsewhere.id)

    # A former userName of an active user: narrowed by that user's memberships, no grant.
    pia, _ = directory.create_user("acme", UserFields("pia"))
    hr, _ = directory.create_group("acme", "hr", None, [pia.id])
    directory.replace_user("acme", pia.id, UserFields("pia.renamed"))
    assert narrowed("pia", ["hr", "audit-eu", "other"]) == ((), ["hr", "other"])
    directory.change_group("acme", hr.id, "hr", None, [], [pia.id])
    assert narrowed("pia", ["hr", "other"]) == ((), ["other"])
    assert narrowed("pia.renamed", ["hr", "other"]) == ((), ["other"])
    directory.replace_user("acme", pia.id, UserFields("pia.renamed", active=False))
    with pytest.raises(GatewayError) as refused:
        narrowed("pia", ["other"])
    assert refused.value.code == "account_disabled"


def test_the_directory_migrates_and_works_on_sqlite(tmp_path: Path) -> None:
    check_directory(upgraded(f"sqlite:///{tmp_path / 'catalog.db'}", tmp_path / "data"))


@pytest.mark.server
def test_the_directory_migrates_and_works_on_postgres(postgres: Cluster, tmp_path: Path) -> None:
    catalog = upgraded(postgres.new_database(), tmp_path / "data")
    check_directory(catalog)
    # A replica reports the directory version it enforces; a change waits for the others.
    versions = catalog.directory_versions
    catalog.replicas.report(1)
    seen = versions.poll()[""]
    assert catalog.replicas.label in versions.behind(seen)
    versions._report(seen)
    assert versions.behind(seen) == []


def test_requests_see_a_change_made_by_another_process_at_once(tmp_path: Path) -> None:
    path = tmp_path / "catalog.db"
    serving, writer = Catalog(path), Catalog(path)  # two processes' catalogs
    identity = DirectoryIdentity(serving.directory, serving.directory_versions)
    policy = Policy()
    claims = {"sub": "bo", "tenant": "acme", "region": "EU"}
    assert identity.groups_for(claims, policy) is None  # no directory: nothing asked
    bo, _ = writer.directory.create_user("acme", UserFields("bo"))
    assert identity.groups_for(claims, policy) == DirectoryGroups()
    group, _ = writer.directory.create_group("acme", "risk", None, [bo.id])
    assert identity.groups_for(claims, policy) == DirectoryGroups(("risk",))
    writer.directory.change_group("acme", group.id, "risk", None, [], [bo.id])
    assert identity.groups_for(claims, policy) == DirectoryGroups()
    writer.directory.replace_user("acme", bo.id, UserFields("bo", active=False))
    with pytest.raises(GatewayError) as refused:
        identity.groups_for(claims, policy)
    assert refused.value.code == "account_disabled"
    by_id = Policy.model_validate({"directory": {"user_claim": "oid", "user_attribute": "id"}})
    assert identity.groups_for({"oid": "nobody", "tenant": "acme"}, by_id) is None


def test_the_directory_block_rejects_unknown_keys_and_attributes() -> None:
    for bad in ({"user_claim": "sub", "extra": 1}, {"user_attribute": "emails"}):
        with pytest.raises(ValueError):
            Policy.model_validate({"directory": bad})
    assert Policy().directory.user_claim == "sub"
    assert Policy().directory.user_attribute == "userName"


def test_a_request_asks_the_catalog_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`resolve` answers a cache hit on the event loop and runs a miss (the entry's query,
    a poll of the versions with a database server) in a worker thread."""
    catalog = Catalog(tmp_path / "catalog.db")
    identity = DirectoryIdentity(catalog.directory, catalog.directory_versions)
    bo, _ = catalog.directory.create_user("acme", UserFields("bo"))
    catalog.directory.create_group("acme", "risk", None, [bo.id])
    asked: list[str] = []
    for name in ("entry", "versions"):
        real = getattr(catalog.directory, name)

        def recorded(*args: Any, _real: Any = real, _name: str = name) -> Any:
            asked.append(f"{_name} on {threading.current_thread().name}")
            return _real(*args)

        monkeypatch.setattr(catalog.directory, name, recorded)
    claims, policy = {"sub": "bo", "tenant": "acme"}, Policy()

    async def twice() -> list[DirectoryGroups | None]:
        return [await identity.resolve(claims, policy) for _ in range(2)]

    assert asyncio.run(twice()) == [DirectoryGroups(("risk",))] * 2
    assert len(asked) == 1 and "MainThread" not in asked[0], asked  # the second one hit
    # As with a database server: the versions are polled, and the poll is a query too.
    monkeypatch.setattr(catalog.directory_versions, "_raw", None)
    asked.clear()
    assert asyncio.run(twice()) == [DirectoryGroups(("risk",))] * 2
    assert [a.split()[0] for a in asked] == ["versions"], asked
    assert "MainThread" not in asked[0], asked


def test_a_token_without_the_user_claim_is_refused_where_the_tenant_has_a_directory(
    tmp_path: Path,
) -> None:
    """With `user_claim: email`, a deactivated user could ask for a token without the email
    scope and pass as a caller the directory does not know; where the tenant has a
    directory such a token is refused (403 insufficient_claims), elsewhere it costs nothing."""
    catalog = Catalog(tmp_path / "catalog.db")
    identity = DirectoryIdentity(catalog.directory, catalog.directory_versions)
    by_email = Policy.model_validate({"directory": {"user_claim": "email"}})
    catalog.directory.create_user("acme", UserFields("cy@corp", active=False))
    disabled = {"sub": "cy", "tenant": "acme", "email": "cy@corp"}
    for unnamed in ({"sub": "cy", "tenant": "acme"}, {**disabled, "email": ["cy@corp"]}):
        for ask in (
            lambda c: identity.groups_for(c, by_email),
            lambda c: asyncio.run(identity.resolve(c, by_email)),
        ):
            with pytest.raises(GatewayError) as refused:
                ask(unnamed)
            assert refused.value.code == "insufficient_claims"
    with pytest.raises(GatewayError) as refused:
        identity.groups_for(disabled, by_email)
    assert refused.value.code == "account_disabled"
    assert identity.groups_for({"sub": "cy", "tenant": "globex"}, by_email) is None
