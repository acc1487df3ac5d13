"""`attributes` and `excludedAttributes` (RFC 7644 s3.9) on every /scim/v2 route that answers
a resource: GET of one and of a list, POST .search, POST, PUT and PATCH, for Users and
Groups. An identity provider that sends `excludedAttributes=members` with its PATCH of a
large group gets no copy of every member back; names are attribute notation (`name`,
`name.givenName`, after a schema URN or not), compared without regard to case; a name that
is no attribute is ignored; `id` and `schemas` are always returned, `meta` by default; a
value of a megabyte is answered as any other."""

from __future__ import annotations

from typing import Any

from tests.helpers.scim import GROUP, PATCH, USER, Scim

ENTERPRISE = "urn:ietf:params:scim:schemas:extension:enterprise:2.0:User"


def user_body(user_name: str) -> dict[str, Any]:
    return {
        "schemas": [USER, ENTERPRISE],
        "userName": user_name,
        "name": {"givenName": "Ann", "familyName": "Lee"},
        "emails": [{"value": f"{user_name}@example.com", "type": "work", "primary": True}],
        "title": "Buyer",
        ENTERPRISE: {"employeeNumber": "701", "department": "Sales"},
    }


def test_a_group_write_answers_without_members_when_asked(acme: Scim) -> None:
    ann, bob, cy = (acme.user(f"{n}.members") for n in ("ann", "bob", "cy"))
    body = {"schemas": [GROUP], "displayName": "buyers", "members": [{"value": ann}]}
    made = acme("POST", "/Groups?excludedAttributes=members", body)
    assert made.status_code == 201, made.text
    group = made.json()
    assert "members" not in group and group["displayName"] == "buyers"
    assert group["schemas"] == [GROUP] and group["meta"]["resourceType"] == "Group"
    path = f"/Groups/{group['id']}"

    add = {"op": "add", "path": "members", "value": [{"value": bob}]}
    patched = acme(
        "PATCH", f"{path}?excludedAttributes=members", {"schemas": [PATCH], "Operations": [add]}
    )
    assert patched.status_code == 200, patched.text
    assert "members" not in patched.json() and patched.json()["id"] == group["id"]
    assert {m["value"] for m in acme("GET", path).json()["members"]} == {ann, bob}

    replaced = acme(
        "PUT",
        f"{path}?attributes=displayName",
        {**body, "members": [{"value": ann}, {"value": bob}, {"value": cy}]},
    )
    assert replaced.status_code == 200, replaced.text
    assert replaced.json() == {"schemas": [GROUP], "id": group["id"], "displayName": "buyers"}

    # The writes happened, and a PATCH that asks for nothing less answers the whole group.
    remove = {"op": "remove", "path": f'members[value eq "{cy}"]'}
    whole = acme.patch(path, remove).json()
    assert {m["value"] for m in whole["members"]} == {ann, bob}
    assert whole["meta"]["location"].endswith(path)


def test_a_user_write_answers_the_attributes_asked_for(acme: Scim) -> None:
    made = acme("POST", "/Users?attributes=userName", user_body("dee.written"))
    assert made.status_code == 201, made.text
    user = made.json()
    assert user == {"schemas": [USER, ENTERPRISE], "id": user["id"], "userName": "dee.written"}
    assert made.headers["location"].endswith(f"/Users/{user['id']}")
    path = f"/Users/{user['id']}"

    replaced = acme(
        "PUT", f"{path}?excludedAttributes=name.givenName,emails", user_body("dee.written")
    )
    assert replaced.status_code == 200, replaced.text
    shown = replaced.json()
    assert shown["name"] == {"familyName": "Lee"} and "emails" not in shown
    assert shown["title"] == "Buyer" and shown["meta"]["resourceType"] == "User"

    number = f"{ENTERPRISE}:employeeNumber"
    op = {"op": "replace", "path": "title", "value": "Lead buyer"}
    patched = acme(
        "PATCH", f"{path}?attributes={number},title", {"schemas": [PATCH], "Operations": [op]}
    )
    assert patched.status_code == 200, patched.text
    assert patched.json() == {
        "schemas": [USER, ENTERPRISE],
        "id": user["id"],
        "title": "Lead buyer",
        ENTERPRISE: {"employeeNumber": "701"},
    }


def test_reads_take_sub_attributes_schema_urns_and_any_case(acme: Scim) -> None:
    user = acme.user(
        "eve.reads", **{k: v for k, v in user_body("eve.reads").items() if k != "userName"}
    )
    path = f"/Users/{user}"
    one = acme("GET", f"{path}?attributes=NAME.givenname,Emails.Value,{USER}:userName").json()
    assert one == {
        "schemas": [USER, ENTERPRISE],
        "id": user,
        "userName": "eve.reads",
        "name": {"givenName": "Ann"},
        "emails": [{"value": "eve.reads@example.com"}],
    }
    extension = acme("GET", f"{path}?attributes={ENTERPRISE.upper()}").json()
    assert extension[ENTERPRISE] == {"employeeNumber": "701", "department": "Sales"}
    assert set(extension) == {"schemas", "id", ENTERPRISE}
    dropped = acme("GET", f"{path}?excludedAttributes={ENTERPRISE}:department,emails.type").json()
    assert dropped[ENTERPRISE] == {"employeeNumber": "701"}
    assert dropped["emails"] == [{"value": "eve.reads@example.com", "primary": True}]

    listed = acme("GET", '/Users?filter=userName eq "eve.reads"&attributes=name.familyName').json()
    assert listed["Resources"] == [
        {"schemas": [USER, ENTERPRISE], "id": user, "name": {"familyName": "Lee"}}
    ]
    search = {
        "schemas": ["urn:ietf:params:scim:api:messages:2.0:SearchRequest"],
        "filter": 'userName eq "eve.reads"',
        "excludedAttributes": ["name", "emails", "meta", "groups", ENTERPRISE, "title"],
    }
    found = acme("POST", "/Users/.search", search).json()
    assert found["Resources"] == [
        {"schemas": [USER, ENTERPRISE], "id": user, "userName": "eve.reads"}
    ]


def test_meta_is_returned_by_default_and_id_and_schemas_always(acme: Scim) -> None:
    user = acme.user("fay.meta")
    path = f"/Users/{user}"
    assert "meta" not in acme("GET", f"{path}?attributes=userName").json()
    assert "meta" not in acme("GET", f"{path}?excludedAttributes=meta").json()
    located = acme("GET", f"{path}?attributes=meta.location").json()
    assert located == {
        "schemas": [USER],
        "id": user,
        "meta": {"location": located["meta"]["location"]},
    }
    assert located["meta"]["location"].endswith(path)
    kept = acme("GET", f"{path}?excludedAttributes=id,schemas,userName").json()
    assert kept["id"] == user and kept["schemas"] == [USER] and "userName" not in kept


def test_a_group_read_excluding_a_member_sub_attribute_still_has_its_members(acme: Scim) -> None:
    gus = acme.user("gus.member")
    crew = acme.group("member-crew", gus)
    for query in ("excludedAttributes=members.display", "attributes=members.value,displayName"):
        read = acme("GET", f"/Groups/{crew}?{query}").json()
        assert [m["value"] for m in read["members"]] == [gus], query
        listed = acme("GET", f'/Groups?filter=displayName eq "member-crew"&{query}').json()
        assert [m["value"] for m in listed["Resources"][0]["members"]] == [gus], query
    values = acme("GET", f"/Groups/{crew}?attributes=members.value").json()
    assert values == {"schemas": [GROUP], "id": crew, "members": [{"value": gus}]}


def test_unknown_names_are_ignored(acme: Scim) -> None:
    hal = acme.user("hal.unknown", title="Clerk")
    path = f"/Users/{hal}"
    whole = acme("GET", path).json()
    assert acme("GET", f"{path}?excludedAttributes=nosuch,name.nosuch,title.sub").json() == whole
    assert acme("GET", f"{path}?attributes=nosuch,userName").json() == {
        "schemas": [USER],
        "id": hal,
        "userName": "hal.unknown",
    }
    nothing = {"schemas": [USER], "id": hal}
    for names in ("nosuch", "title.sub", "urn:nosuch:title", "name.givenName.more", ",,", " "):
        assert acme("GET", f"{path}?attributes={names}").json() == nothing, names


def test_huge_values_are_answered(acme: Scim) -> None:
    ida = acme.user("ida.huge", title="Clerk")
    acme.group("huge-crew", ida)
    unknown = [f"nosuch{i}" for i in range(4_000)]  # near the 64 KiB a request head may hold
    names = ",".join([*unknown, "userName"])
    got = acme.client.get(
        f"/scim/v2/Users/{ida}", params={"attributes": names}, headers=acme.headers
    )
    assert got.status_code == 200, got.text
    assert got.json() == {"schemas": [USER], "id": ida, "userName": "ida.huge"}

    # Nearly the 1 MiB a SCIM body may hold: many names, one long one, one of many parts.
    many = [f"nosuch{i}" for i in range(40_000)]
    odd = ["x" * 200_000, "a." * 100_000 + "b", "userName"]
    for kind in ("Users", "Groups"):
        search = {
            "schemas": ["urn:ietf:params:scim:api:messages:2.0:SearchRequest"],
            "attributes": [*many, *odd, "displayName"],
        }
        found = acme("POST", f"/{kind}/.search", search)
        assert found.status_code == 200, found.text[:300]
        resources = found.json()["Resources"]
        assert resources and all(
            set(r) <= {"schemas", "id", "userName", "displayName"} for r in resources
        )
        dropped = acme(
            "POST",
            f"/{kind}/.search",
            {**search, "attributes": None, "excludedAttributes": [*many, *odd, "meta"]},
        )
        assert dropped.status_code == 200, dropped.text[:300]
        assert all("meta" not in r and "id" in r for r in dropped.json()["Resources"])
