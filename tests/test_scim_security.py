"""The directory's defences that the security review asked for (docs/security.md,
"Directory keys provision and do nothing else" and "A deprovisioned user is refused"):
concurrent writes never undo a deactivation or lose a membership change."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import Request
from fastapi.testclient import TestClient

from gateway.api import scim as scim_routes
from gateway.api.security import authenticated_caller, scim_caller
from gateway.domain import Caller
from gateway.errors import GatewayError
from gateway.storage import schema
from gateway.storage.catalog import Catalog, open_engine
from gateway.storage.directory import DirGroup, Entry, UserFields
from gateway.storage.layout import DataLayout
from tests.helpers.datadirs import copy_data_dir
from tests.helpers.identity import AUDIENCE, ISSUER, bearer
from tests.helpers.postgres import Cluster
from tests.helpers.processes import gateway_env, running_server
from tests.helpers.scim import USER, Scim, scim_key


def test_a_concurrent_patch_never_undoes_a_deactivation(
    acme: Scim, app: tuple[TestClient, DataLayout], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A title PATCH is being applied when another writer (another replica's deactivation)
    commits: the title PATCH must apply to the deactivated user, or wait for it, and never
    write `active: true` back from what it read before."""
    ida = acme.user("ida")
    other = app[1].open_catalog()  # another process's writer, on the same catalog
    real = scim_routes.patch_user
    deactivation = threading.Thread(
        target=other.directory.replace_user,
        args=("acme", ida, UserFields("ida", active=False)),
    )

    def interleaved(doc: dict[str, Any], ops: Any) -> dict[str, Any]:
        if not deactivation.is_alive() and deactivation.ident is None:
            deactivation.start()
            deactivation.join(timeout=1.0)  # done at once unless this write holds the lock
        return real(doc, ops)

    monkeypatch.setattr(scim_routes, "patch_user", interleaved)
    changed = acme.patch(f"/Users/{ida}", {"op": "replace", "path": "title", "value": "CFO"})
    assert changed.status_code == 200, changed.text
    deactivation.join(timeout=15)
    assert not deactivation.is_alive()
    kept = other.directory.entry("acme", "userName", "ida")
    assert kept is not None and not kept.active  # refused: the title PATCH kept the deactivation


@pytest.mark.sleeps
def test_concurrent_group_and_user_writes_each_see_the_others(tmp_path: Path) -> None:
    """Eight writers each add one member by rewriting the whole member list they read, and
    eight each change one attribute of one user: nothing is lost, because each reads the
    row inside its own write transaction."""
    concurrent_writes(Catalog(tmp_path / "catalog.db"))


@pytest.mark.sleeps
@pytest.mark.server
def test_concurrent_writes_each_see_the_others_on_postgres(
    postgres: Cluster, tmp_path: Path
) -> None:
    """The same on PostgreSQL, where the version bump's row lock orders the writers."""
    url = postgres.new_database()
    schema.upgrade(open_engine(url))
    concurrent_writes(DataLayout(tmp_path / "data", url).open_catalog())


def concurrent_writes(catalog: Catalog) -> None:
    directory = catalog.directory
    users = [directory.create_user("acme", UserFields(f"u{i}"))[0].id for i in range(8)]
    group, _ = directory.create_group("acme", "all", None, [])
    target, _ = directory.create_user("acme", UserFields("target"))

    def add(user_id: str) -> None:
        def change(old: DirGroup) -> tuple[str, str | None, list[str]]:
            time.sleep(0.01)  # a slow client-side computation between read and write
            return old.display_name, old.external_id, [u for u, _ in old.members] + [user_id]

        directory.update_group("acme", group.id, change)

    def mark(i: int) -> None:
        def change(old: Any) -> UserFields:
            time.sleep(0.01)
            attributes = {**old.fields.attributes, f"x{i}": i}
            return UserFields(old.fields.user_name, attributes=attributes)

        directory.update_user("acme", target.id, change)

    threads = [threading.Thread(target=add, args=(u,)) for u in users]
    threads += [threading.Thread(target=mark, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    found = directory.group("acme", group.id)
    assert found is not None and {u for u, _ in found.members} == set(users)
    user = directory.user("acme", target.id)
    assert user is not None and {k for k in user.fields.attributes} == {f"x{i}" for i in range(8)}


@pytest.mark.server
def test_a_served_scim_filter_leaves_no_user_name_in_the_log(
    tmp_path: Path, data_dir: Path, jwks_file: Path
) -> None:
    """uvicorn's access log wrote the path with its query string, and with it the email
    in `filter=userName eq "..."`; the line stays, the query string does not."""
    root = copy_data_dir(data_dir, tmp_path / "data")
    key = scim_key(DataLayout(root), "acme")
    env = gateway_env(
        GATEWAY_DATA_DIR=str(root),
        GATEWAY_OIDC_ISSUER=ISSUER,
        GATEWAY_OIDC_AUDIENCE=AUDIENCE,
        GATEWAY_JWKS_URI=jwks_file.as_uri(),
        GATEWAY_POLICY_WATCH_INTERVAL_S="0",
    )
    email = "alice.secret@corp.example"
    with running_server(env, stdout=subprocess.PIPE) as (base, process):
        for query in (f'filter=userName eq "{email}"', f"filter=userName%20eq%20%22{email}%22"):
            answered = httpx.get(f"{base}/scim/v2/Users?{query}", headers=bearer(key))
            assert answered.status_code == 200, answered.text
        process.terminate()
        process.wait(timeout=30)
        assert process.stdout is not None and process.stderr is not None
        said = process.stdout.read().decode() + process.stderr.read().decode()
    assert "GET /scim/v2/Users HTTP/1.1" in said  # the access log still has the request
    assert "alice" not in said and "corp.example" not in said, said[-2000:]


def test_a_patch_adding_values_is_capped_per_operation_and_costs_no_quadratic_scan(
    acme: Scim,
) -> None:
    """Forty `add emails` of 1,000 new values each (a body under the 1 MiB SCIM limit):
    before, each value was looked for in a list that grew by 1,000 per operation (about 8e8
    comparisons, tens of seconds) and the 1,000-value cap was checked after them all; now
    the second operation is refused at once."""
    jo = acme.user("jo", emails=[{"value": "jo@x"}])
    ops = [
        {
            "op": "add",
            "path": "emails",
            "value": [{"value": f"{k * 1000 + i}@x"} for i in range(1000)],
        }
        for k in range(40)
    ]
    started = time.monotonic()
    refused = acme.patch(f"/Users/{jo}", *ops)
    took = time.monotonic() - started
    assert refused.status_code == 400 and refused.json()["scimType"] == "invalidValue"
    assert took < 5, took
    assert acme("GET", f"/Users/{jo}").json()["emails"] == [{"value": "jo@x"}]
    # Values already there, in another key order, are not added twice.
    same = acme.patch(
        f"/Users/{jo}",
        {"op": "add", "path": "emails", "value": [{"value": "jo@x"}, {"value": "b@x"}]},
    )
    assert same.json()["emails"] == [{"value": "jo@x"}, {"value": "b@x"}], same.text


def test_the_member_cap_counts_members_named_without_a_path(
    acme: Scim, app: tuple[TestClient, DataLayout]
) -> None:
    """Two path-less operations of {"members": [600 values]} name 1,200 members: only
    top-level list values were counted (zero here), so the request went through."""
    directory = app[1].open_catalog().directory
    ids = [directory.create_user("acme", UserFields(f"cap{i}"))[0].id for i in range(600)]
    group = acme.group("capped")
    members = [{"value": i} for i in ids]
    for ops in (
        [{"op": "add", "value": {"members": members}}] * 2,
        [{"op": "add", "value": {"urn:ietf:params:scim:schemas:core:2.0:Group:members": members}}]
        * 2,
        [{"op": "replace", "path": "members", "value": members}]
        + [{"op": "add", "value": {"members": members}}],
    ):
        refused = acme.patch(f"/Groups/{group}", *ops)
        assert refused.status_code == 400, refused.text[:300]
        assert "at most 1000 per request" in refused.json()["detail"]
    assert "members" not in acme("GET", f"/Groups/{group}").json()
    added = acme.patch(f"/Groups/{group}", {"op": "add", "value": {"members": members}})
    assert added.status_code == 200 and len(added.json()["members"]) == 600, added.text[:300]


def test_removing_active_or_nulling_it_never_turns_a_user_active_again(
    acme: Scim, app: tuple[TestClient, DataLayout]
) -> None:
    """`active` is optional (RFC 7643): a PATCH removing it, or setting it to null, and a
    PUT without it leave the attribute unset (as RFC 7644 says a removal does) and the
    user as it was: only `active: true` reactivates."""
    directory = app[1].open_catalog().directory

    def may_act(user_name: str) -> bool:
        entry = directory.entry("acme", "userName", user_name)
        return entry is not None and entry.active

    kim = acme.user("kim", active=False)
    for ops in (
        [{"op": "remove", "path": "active"}],
        [{"op": "replace", "path": "active", "value": None}],
        [{"op": "replace", "value": {"active": None}}],
    ):
        patched = acme.patch(f"/Users/{kim}", *ops)
        assert patched.status_code == 200 and "active" not in patched.json(), patched.text
        assert not may_act("kim")
    replaced = acme("PUT", f"/Users/{kim}", {"schemas": [USER], "userName": "kim"})
    assert replaced.status_code == 200 and not may_act("kim"), replaced.text
    back = acme.patch(f"/Users/{kim}", {"op": "replace", "path": "active", "value": True})
    assert back.json()["active"] is True and may_act("kim")
    kept = acme.patch(f"/Users/{kim}", {"op": "remove", "path": "active"}).json()
    assert "active" not in kept and may_act("kim"), kept  # as stored: active
    acme.user("lee")
    assert may_act("lee")  # created without it: active


def test_users_sharing_an_external_id_are_refused_if_any_is_inactive(tmp_path: Path) -> None:
    """With `user_attribute: externalId`, two live users may share one: the caller is
    refused if any is inactive, and holds only the groups they all share."""
    directory = Catalog(tmp_path / "catalog.db").directory
    one, _ = directory.create_user("acme", UserFields("one", external_id="E"))
    two, _ = directory.create_user("acme", UserFields("two", external_id="E"))
    directory.create_group("acme", "both", None, [one.id, two.id])
    directory.create_group("acme", "only-one", None, [one.id])
    assert directory.entry("acme", "externalId", "E") == Entry(True, ("both",))
    for user in (one, two):
        name = user.fields.user_name
        directory.replace_user("acme", user.id, UserFields(name, "E", active=False))
        assert directory.entry("acme", "externalId", "E") == Entry(False, ())
        directory.replace_user("acme", user.id, UserFields(name, "E"))
    directory.delete_user("acme", two.id)  # a tombstone beside a live user: the live one
    assert directory.entry("acme", "externalId", "E") == Entry(True, ("both", "only-one"))


def test_a_caller_authenticated_before_the_route_is_checked_again_for_its_scope() -> None:
    """Requests with a body are authenticated before it is read (gateway.api.limits) and
    the route's dependency takes that caller: it still checks the scope, so a non-`scim`
    caller never reaches /scim/v2 and a `scim` key nothing else, whoever set it."""

    def request_with(scope: str) -> Request:
        request = Request({"type": "http", "method": "POST", "path": "/", "headers": []})
        request.state.caller = Caller("s", "acme", "", frozenset(), frozenset(), scope=scope)
        return request

    for scope in ("any", "search", "ingest"):
        with pytest.raises(GatewayError) as refused:
            asyncio.run(scim_caller(request_with(scope), None))
        assert refused.value.code == "forbidden"
        assert asyncio.run(authenticated_caller(request_with(scope), None)).scope == scope
    with pytest.raises(GatewayError) as refused:
        asyncio.run(authenticated_caller(request_with("scim"), None))
    assert refused.value.code == "forbidden"
    assert asyncio.run(scim_caller(request_with("scim"), None)).scope == "scim"


def test_values_no_directory_can_hold_are_scim_errors_not_500s(acme: Scim) -> None:
    """A filter's value and a path's ID go to the database as they come: a lone surrogate
    (SQLite cannot encode it) or a NUL (PostgreSQL refuses it) was a 500."""
    for path in (
        '/Users?filter=userName eq "\\ud800"',
        '/Users?filter=externalId eq "a\\u0000b"',
        '/Groups?filter=displayName eq "\\ud800"',
    ):
        refused = acme("GET", path)
        assert refused.status_code == 400, (path, refused.text)
        assert refused.json()["scimType"] == "invalidFilter"
    searched = acme("POST", "/Users/.search", {"filter": 'userName eq "\\ud800"'})
    assert searched.status_code == 400, searched.text
    for path in ("/Users/%00", "/Groups/%00", "/Users/%ED%A0%80"):
        assert acme("GET", path).status_code == 404, path
        assert acme("DELETE", path).status_code == 404, path
