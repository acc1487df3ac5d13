"""The directory decides who a caller is, whatever its token says (docs/security.md,
"Deprovisioning is enforced on the next request"): a group of the token's `groups` claim
that the directory has, or had before it deleted or renamed it, counts only while the
directory holds the user in a group of that name, also for a token naming a user's former
userName (which gains none of that user's groups); a recycled
userName or externalId does not hand the former holder's tokens to the new user; a write
that takes access away is answered once every replica enforces it; polled versions never
go backwards; and userNames are compared in Unicode NFC with ASCII letters folded alone
(the Kelvin sign is canonically the letter K; "Ä" is not "ä")."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from gateway.api.app import create_app
from gateway.authn.devkeys import SigningKey
from gateway.authn.directory import DirectoryIdentity
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.policy.model import Policy
from gateway.policy.resolve import DirectoryGroups
from gateway.storage import schema
from gateway.storage.catalog import Catalog, open_engine
from gateway.storage.directory import Directory, UserFields
from gateway.storage.directory_versions import DirectoryVersions
from gateway.storage.layout import DataLayout
from tests.helpers.datadirs import copy_data_dir
from tests.helpers.identity import AUDIENCE, ISSUER, TokenFactory, bearer, make_settings
from tests.helpers.policies import write_policy
from tests.helpers.postgres import Cluster
from tests.helpers.scim import USER, Scim, scim_key

FRAUD = "merchants above MRX-7781"  # finds merchant-fraud, for group:merchant-risk only


def search(client: TestClient, token: str, query: str = FRAUD) -> Any:
    return client.post("/search", json={"query": query, "top_k": 50}, headers=bearer(token))


def sees_fraud(client: TestClient, token: str) -> bool:
    response = search(client, token)
    assert response.status_code == 200, response.text
    return "merchant-fraud" in {r["doc_id"] for r in response.json()["results"]}


def refused(response: Any) -> bool:
    return bool(response.status_code == 403 and response.json()["code"] == "account_disabled")


# -- 1. a token group the directory has counts only while it holds the user -------------


def test_a_token_group_the_directory_has_counts_only_while_it_holds_the_user(
    acme: Scim, app: tuple[TestClient, DataLayout], make_token: TokenFactory
) -> None:
    client = app[0]
    uma = acme.user("uma")
    token = make_token(sub="uma", groups=["merchant-risk"])
    stranger = make_token(sub="no-directory-user", groups=["merchant-risk"])
    assert sees_fraud(client, token)  # a group the directory does not have: the token's
    risk = acme.group("merchant-risk", uma)
    assert sees_fraud(client, token)
    removed = acme.patch(f"/Groups/{risk}", {"op": "remove", "path": f'members[value eq "{uma}"]'})
    assert removed.status_code == 200
    assert not sees_fraud(client, token)  # the token still lists it: the directory decides
    explained = client.post(
        "/admin/explain",
        json={
            "subject": {
                "sub": "uma",
                "tenant": "acme",
                "region": "EU",
                "groups": ["merchant-risk"],
            },
            "doc_id": "merchant-fraud",
        },
        headers=bearer(make_token(sub="root", groups=["ops"])),
    ).json()
    assert not explained["visible"], explained
    assert "group:merchant-risk" not in explained["caller"]["principals"]
    assert sees_fraud(client, stranger)  # a caller the directory does not know: its token's
    # The token's other groups stand: staff still reads the refund policy.
    staff = make_token(sub="uma", groups=["merchant-risk", "staff"])
    found = search(client, staff, "refunds paid RPL-14").json()["results"]
    assert "refund-policy" in {r["doc_id"] for r in found}
    acme.patch(f"/Groups/{risk}", {"op": "add", "path": "members", "value": [{"value": uma}]})
    assert sees_fraud(client, token)
    acme.patch(f"/Groups/{risk}", {"op": "replace", "path": "displayName", "value": "risk-2"})
    # A name the directory had stays its own: renaming the group does not give it back to
    # the token (uma holds group:risk-2 now, not group:merchant-risk).
    assert not sees_fraud(client, token)
    acme.patch(
        f"/Groups/{risk}", {"op": "replace", "path": "displayName", "value": "merchant-risk"}
    )
    assert sees_fraud(client, token)
    acme.patch(f"/Groups/{risk}", {"op": "remove", "path": "members"})
    assert not sees_fraud(client, token)
    assert acme("DELETE", f"/Groups/{risk}").status_code == 204
    assert not sees_fraud(client, token)  # deleted: still the directory's name, not held
    assert sees_fraud(client, stranger)  # a caller the directory does not know: its token's
    again = acme.group("merchant-risk", uma)  # created again under the name: simply current
    assert sees_fraud(client, token)
    assert acme("DELETE", f"/Groups/{again}").status_code == 204
    assert not sees_fraud(client, token)


def test_a_token_naming_a_former_user_name_is_narrowed_by_its_user(
    acme: Scim, app: tuple[TestClient, DataLayout], make_token: TokenFactory
) -> None:
    """A token naming the userName an active user was renamed from is not that user's
    caller (it gains none of its groups), but the directory still decides for the groups
    it manages: the token keeps one only while the renamed user is in it."""
    client = app[0]
    vic = acme.user("vic-n")
    risk = acme.group("merchant-risk", vic)
    old_name = make_token(sub="vic-n", groups=["merchant-risk"])
    assert sees_fraud(client, old_name)
    renamed = acme.patch(f"/Users/{vic}", {"op": "replace", "path": "userName", "value": "vick"})
    assert renamed.status_code == 200, renamed.text
    new_name = make_token(sub="vick", groups=["merchant-risk"])
    assert sees_fraud(client, old_name) and sees_fraud(client, new_name)
    assert not sees_fraud(client, make_token(sub="vic-n"))  # vick's groups are not granted
    assert sees_fraud(client, make_token(sub="vick"))
    removed = acme.patch(f"/Groups/{risk}", {"op": "remove", "path": f'members[value eq "{vic}"]'})
    assert removed.status_code == 200, removed.text
    assert not sees_fraud(client, new_name)
    assert not sees_fraud(client, old_name)  # the former userName is narrowed alike
    staff = make_token(sub="vic-n", groups=["merchant-risk", "staff"])
    found = search(client, staff, "refunds paid RPL-14").json()["results"]
    assert "refund-policy" in {r["doc_id"] for r in found}  # a group it never managed stays
    assert acme("DELETE", f"/Groups/{risk}").status_code == 204


def test_another_process_narrows_token_groups_on_the_next_request(tmp_path: Path) -> None:
    """The directory's group names are cached per version, as entries are: a group another
    process creates, or a membership it removes, counts on this process's next request."""
    path = tmp_path / "catalog.db"
    serving, writer = Catalog(path), Catalog(path)
    identity = DirectoryIdentity(serving.directory, serving.directory_versions)
    policy = Policy()

    def groups_after(listed: list[str]) -> tuple[list[str], tuple[str, ...] | None]:
        claims: dict[str, Any] = {"sub": "bo", "tenant": "acme", "groups": listed}
        found = identity.groups_for(claims, policy)
        kept = [g for g in listed if found is None or g not in found.withheld]
        return kept, (None if found is None else found.held)

    bo, _ = writer.directory.create_user("acme", UserFields("bo"))
    assert groups_after(["risk", "staff"]) == (["risk", "staff"], ())
    risk, _ = writer.directory.create_group("acme", "risk", None, [])
    assert groups_after(["risk", "staff"]) == (["staff"], ())
    writer.directory.change_group("acme", risk.id, "risk", None, [bo.id], [])
    assert groups_after(["risk", "staff"]) == (["risk", "staff"], ("risk",))
    writer.directory.change_group("acme", risk.id, "risk", None, [], [bo.id])
    assert groups_after(["risk", "staff"]) == (["staff"], ())
    claims = {"sub": "someone-else", "tenant": "acme", "groups": ["risk"]}
    assert identity.groups_for(claims, policy) is None and claims["groups"] == ["risk"]
    # A group deleted, or renamed, by the other process: its former name stays managed.
    writer.directory.delete_group("acme", risk.id)
    assert groups_after(["risk", "staff"]) == (["staff"], ())
    hr, _ = writer.directory.create_group("acme", "hr", None, [])
    assert groups_after(["hr", "staff"]) == (["staff"], ())
    writer.directory.change_group("acme", hr.id, "people", None, [], [])
    assert groups_after(["hr", "people", "staff"]) == (["staff"], ())


# -- 2. a recycled userName or externalId ------------------------------------------------


def test_a_recycled_user_name_refuses_the_former_holders_tokens(
    acme: Scim,
    app: tuple[TestClient, DataLayout],
    make_token: TokenFactory,
    signing_key: SigningKey,
) -> None:
    client = app[0]
    before = int(time.time()) - 120  # issued two minutes ago: past the 30 s leeway
    old_bob = make_token(sub="bob-r", iat=before)
    first = acme.user("bob-r")
    assert search(client, old_bob).status_code == 200
    assert acme("DELETE", f"/Users/{first}").status_code == 204
    assert refused(search(client, old_bob))  # the tombstone
    acme.user("bob-r")  # someone else, given the name
    assert refused(search(client, old_bob))  # still the former holder's token
    assert search(client, make_token(sub="bob-r")).status_code == 200  # the new holder's
    now = int(time.time())
    no_iat = {"iss": ISSUER, "aud": AUDIENCE, "sub": "bob-r", "tenant": "acme", "region": "EU"}
    unknown = signing_key.sign({**no_iat, "exp": now + 300})
    assert search(client, unknown).status_code == 200  # no iat: cannot tell, as before

    # A name taken from a user renamed while active: its old tokens were that user's.
    cal = acme.user("cal-r")
    old_cal = make_token(sub="cal-r", iat=before)
    acme.patch(f"/Users/{cal}", {"op": "replace", "path": "userName", "value": "cal-renamed"})
    assert search(client, old_cal).status_code == 200  # a caller the directory does not know
    acme.user("cal-r")
    assert refused(search(client, old_cal))

    # Provisioned for the first time after the token was issued: just in time, it works.
    early = make_token(sub="dee-r", iat=before)
    assert search(client, early).status_code == 200
    acme.user("dee-r")
    assert search(client, early).status_code == 200


def test_a_recycled_external_id_refuses_the_former_holders_tokens(tmp_path: Path) -> None:
    catalog = Catalog(tmp_path / "catalog.db")
    directory = catalog.directory
    identity = DirectoryIdentity(directory, catalog.directory_versions)
    by_oid = Policy.model_validate(
        {"directory": {"user_claim": "oid", "user_attribute": "externalId"}}
    )
    before = time.time() - 120

    def ask(oid: str, iat: float | None) -> DirectoryGroups | None:
        claims: dict[str, Any] = {"sub": "x", "tenant": "acme", "oid": oid}
        if iat is not None:
            claims["iat"] = iat
        return identity.groups_for(claims, by_oid)

    first, _ = directory.create_user("acme", UserFields("eve", external_id="oid-7"))
    assert ask("oid-7", before) == DirectoryGroups()
    directory.delete_user("acme", first.id)
    second, _ = directory.create_user("acme", UserFields("eve2", external_id="oid-7"))
    with pytest.raises(GatewayError) as refusal:
        ask("oid-7", before)
    assert refusal.value.code == "account_disabled"
    assert ask("oid-7", time.time()) == ask("oid-7", None) == DirectoryGroups()
    # Moved away and taken back by the same user: its own value, stamped as it was.
    fresh, _ = directory.create_user("acme", UserFields("fay", external_id="oid-8"))
    for value in ("oid-9", "oid-8"):
        directory.replace_user("acme", fresh.id, UserFields("fay", value))
    assert ask("oid-8", before) == DirectoryGroups()


# -- 3. writes that take access away wait for every replica -------------------------------


@pytest.mark.server
@pytest.mark.sleeps
def test_an_inactive_create_and_an_external_id_change_wait_for_every_replica(
    postgres: Cluster, tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder
) -> None:
    """Another replica enforces what it polled half a second ago: a SCIM write that takes
    access away is answered only once it reports the write's version; one that only adds
    is answered at once."""
    url = postgres.new_database()
    root = copy_data_dir(data_dir, tmp_path / "data")
    layout = DataLayout(root, url)
    other = layout.open_catalog()  # the other replica, on the same database
    settings = make_settings(root, jwks_file, write_policy(tmp_path / "policy"))
    settings = settings.model_copy(update={"database_url": url})
    stop = threading.Event()

    def lagging_replica() -> None:
        seen = other.directory.versions()[""]
        while not stop.is_set():
            other.replicas.report(0)  # alive
            other.directory_versions._report(seen)  # what it polled one round ago
            seen = other.directory.versions()[""]
            stop.wait(0.5)

    replica = threading.Thread(target=lagging_replica, daemon=True)
    replica.start()
    try:
        with TestClient(create_app(settings, embedder=embedder)) as client:
            scim = Scim(client, scim_key(layout, "acme"))

            def enforced_by_the_other() -> bool:
                with other.engine.connect() as c:
                    reported = c.execute(
                        text("SELECT directory_version FROM replicas WHERE replica_id = :r"),
                        {"r": other.replicas.replica_id},
                    ).scalar_one()
                return bool(reported >= other.directory.versions()[""])

            scim.user("gil")  # only adds: answered at once, before the other replica knows
            assert not enforced_by_the_other()
            made = scim("POST", "/Users", {"schemas": [USER], "userName": "hank", "active": False})
            assert made.status_code == 201, made.text
            assert enforced_by_the_other()  # a token naming hank is refused everywhere now
            ivo = scim.user("ivo", externalId="oid-1")
            moved = scim.patch(
                f"/Users/{ivo}", {"op": "replace", "path": "externalId", "value": "oid-2"}
            )
            assert moved.status_code == 200, moved.text
            assert enforced_by_the_other()
    finally:
        stop.set()
        replica.join(timeout=10)


# -- 4. polled versions never go backwards ------------------------------------------------


def test_a_slow_poll_never_puts_older_versions_back(tmp_path: Path) -> None:
    """With a database server versions are polled, by the watcher and by requests at once:
    a poll that read before a membership was removed but returned after a newer poll put
    the older versions back, and an entry cached before the removal was served again."""
    catalog = Catalog(tmp_path / "catalog.db")
    read, release = threading.Event(), threading.Event()

    class SlowDirectory(Directory):
        """The database's answer to the first poll arrives late (read, then held)."""

        slow = True

        def versions(self) -> dict[str, int]:
            found = super().versions()
            if SlowDirectory.slow:
                SlowDirectory.slow = False
                read.set()
                release.wait(10)
            return found

    directory = SlowDirectory(catalog.engine)
    # An engine of a database server's kind for the versions: no SQLite file to check.
    versions = DirectoryVersions(create_engine("sqlite://"), directory, catalog.replicas)
    identity = DirectoryIdentity(directory, versions)
    bo, _ = directory.create_user("acme", UserFields("bo"))
    cy, _ = directory.create_user("acme", UserFields("cy"))
    risk, _ = directory.create_group("acme", "risk", None, [bo.id, cy.id])
    SlowDirectory.slow = False
    versions.poll()
    for who in ("bo", "cy"):  # both cached with the risk group
        held = identity.groups_for({"sub": who, "tenant": "acme"}, Policy())
        assert held == DirectoryGroups(("risk",))
    SlowDirectory.slow = True
    late = threading.Thread(target=versions.poll)
    late.start()
    assert read.wait(10)
    directory.change_group("acme", risk.id, "risk", None, [], [bo.id, cy.id])
    versions.poll()  # the watcher sees the removal
    assert identity.groups_for({"sub": "bo", "tenant": "acme"}, Policy()) == DirectoryGroups()
    release.set()
    late.join(timeout=10)
    assert identity.groups_for({"sub": "cy", "tenant": "acme"}, Policy()) == DirectoryGroups()


# -- 5. userNames: NFC, and ASCII letters folded alone ------------------------------------


def test_the_kelvin_sign_is_the_letter_k_and_other_letters_keep_their_case(
    acme: Scim, app: tuple[TestClient, DataLayout], make_token: TokenFactory
) -> None:
    """The Kelvin sign is canonically "K" (Unicode NFC, as RFC 8265 compares usernames): a
    user provisioned as "\\u212aim" is "kim", however a token spells it, and a deactivation
    holds for both. Case folds for ASCII letters alone: "Ärzte" and "ärzte" are two users."""
    client = app[0]
    kelvin = acme.user("\u212aim")
    assert acme("POST", "/Users", {"schemas": [USER], "userName": "kim"}).status_code == 409
    acme.patch(f"/Users/{kelvin}", {"op": "replace", "path": "active", "value": False})
    for sub in ("\u212aim", "kim", "KIM"):
        assert refused(search(client, make_token(sub=sub))), sub
    upper = acme.user("\u00c4rzte")
    lower = acme.user("\u00e4rzte")  # another user: no 409
    assert upper != lower
    acme.patch(f"/Users/{upper}", {"op": "replace", "path": "active", "value": False})
    assert refused(search(client, make_token(sub="\u00c4rzte")))
    assert search(client, make_token(sub="\u00e4rzte")).status_code == 200


def check_keys_migrate(url: str, root: Path) -> None:
    """A catalog at 0012 keyed its userNames with `str.lower()`; 0013 keys them again with
    ASCII letters folded alone, and leaves a key a tombstone gave up as it was; 0016 keys
    them in Unicode NFC (the Kelvin sign is "K")."""
    engine = open_engine(url)
    schema.upgrade(engine, "0012")
    rows = [
        ("u1", "\u212aim", "kim"),
        ("u2", "\u00c4rzte", "\u00e4rzte"),
        ("u3", "Zed", "RETIRED-0123"),
        ("u4", "Amy", "amy"),
    ]
    with engine.begin() as c:
        for user_id, name, key in rows:
            c.execute(
                text(
                    "INSERT INTO directory_users (tenant, id, user_name, user_name_key, active,"
                    " deleted, attributes_json, created, modified, revision) VALUES ('acme', :i,"
                    " :n, :k, :a, :d, '{}', '2020-01-01 00:00:00', '2020-01-01 00:00:00', 1)"
                ),
                {
                    "i": user_id,
                    "n": name,
                    "k": key,
                    "a": key != "RETIRED-0123",
                    "d": key == "RETIRED-0123",
                },
            )
    schema.upgrade(engine, "0013")
    with engine.connect() as c:
        keys = {i: k for i, k in c.execute(text("SELECT id, user_name_key FROM directory_users"))}
    assert keys == {"u1": "\u212aim", "u2": "\u00c4rzte", "u3": "RETIRED-0123", "u4": "amy"}
    schema.upgrade(engine)
    directory = DataLayout(root, url).open_catalog().directory
    assert directory.entry("acme", "userName", "\u00c4RZTE") is not None
    assert directory.entry("acme", "userName", "AMY") is not None
    assert directory.entry("acme", "userName", "kim") == directory.entry(
        "acme", "userName", "\u212aim"
    )
    with engine.connect() as c:
        keys = {i: k for i, k in c.execute(text("SELECT id, user_name_key FROM directory_users"))}
    assert keys == {"u1": "kim", "u2": "\u00c4rzte", "u3": "RETIRED-0123", "u4": "amy"}


def test_user_name_keys_migrate_on_sqlite(tmp_path: Path) -> None:
    check_keys_migrate(f"sqlite:///{tmp_path / 'catalog.db'}", tmp_path / "data")


@pytest.mark.server
def test_user_name_keys_migrate_on_postgres(postgres: Cluster, tmp_path: Path) -> None:
    check_keys_migrate(postgres.new_database(), tmp_path / "data")
