"""The bounds of what /scim/v2 stores, the same on every write (POST, PUT and PATCH): a value
of at most 4,096 characters, and one the directory indexes (userName, externalId, a group's
displayName) of at most 2,000 bytes in UTF-8, which every supported database indexes. On
PostgreSQL a longer one was refused by its B-tree index and answered 503
`catalog_unavailable`, which identity providers retry for ever."""

from __future__ import annotations

import random
import string
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.storage.layout import DataLayout
from tests.helpers.datadirs import copy_data_dir
from tests.helpers.identity import make_settings
from tests.helpers.policies import write_policy
from tests.helpers.postgres import Cluster
from tests.helpers.scim import GROUP, USER, Scim, scim_key

LIMIT = 2000  # bytes in UTF-8 of an indexed value
EURO = "\u20ac"  # three bytes in UTF-8


def refused(response: Any, attribute: str, over_bytes: bool = True) -> None:
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["scimType"] == "invalidValue", error
    assert attribute in error["detail"], error
    if over_bytes:
        assert f"{LIMIT} bytes" in error["detail"], error


def noise(length: int, seed: int) -> str:
    """Letters and digits no database compresses below their length."""
    rng = random.Random(seed)
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(length))


def cjk(length: int) -> str:
    """Distinct CJK ideographs, three bytes each in UTF-8."""
    return "".join(chr(0x4E00 + (i * 7919) % 0x5000) for i in range(length))


def test_a_group_patch_keeps_the_bounds_of_a_post(acme: Scim) -> None:
    crew = acme.group("bounded-crew")
    huge = "x" * 100_000
    for attribute in ("displayName", "externalId"):
        with_path = acme.patch(
            f"/Groups/{crew}", {"op": "replace", "path": attribute, "value": huge}
        )
        refused(with_path, attribute, over_bytes=False)
        pathless = acme.patch(f"/Groups/{crew}", {"op": "replace", "value": {attribute: huge}})
        refused(pathless, attribute, over_bytes=False)
    kept = acme("GET", f"/Groups/{crew}").json()
    assert kept["displayName"] == "bounded-crew" and "externalId" not in kept


def test_indexed_values_are_bounded_in_utf8_bytes_on_every_write(acme: Scim) -> None:
    kim = acme.user("bounded-kim")
    crew = acme.group("bounded-team", kim)
    over = EURO * 667  # 667 characters, 2,001 bytes
    writes: list[tuple[str, str, dict[str, Any], str]] = []
    for attribute in ("userName", "externalId"):
        user = {"schemas": [USER], "userName": "bounded-lee", attribute: over}
        writes += [
            ("POST", "/Users", user, attribute),
            (
                "PUT",
                f"/Users/{kim}",
                {**user, "userName": "bounded-kim", attribute: over},
                attribute,
            ),
        ]
    for attribute in ("displayName", "externalId"):
        group = {"schemas": [GROUP], "displayName": "bounded-other", attribute: over}
        writes += [
            ("POST", "/Groups", group, attribute),
            ("PUT", f"/Groups/{crew}", group, attribute),
        ]
    before = acme.everything()
    for method, path, body, attribute in writes:
        refused(acme(method, path, body), attribute)
    for path, attribute in (
        (f"/Users/{kim}", "userName"),
        (f"/Users/{kim}", "externalId"),
        (f"/Groups/{crew}", "displayName"),
        (f"/Groups/{crew}", "externalId"),
    ):
        op = {"op": "replace", "path": attribute, "value": over}
        refused(acme.patch(path, op), attribute)
    assert acme.everything() == before  # nothing was changed

    at_limit = EURO * 666 + "ab"  # 2,000 bytes
    named = acme.patch(f"/Users/{kim}", {"op": "replace", "path": "userName", "value": at_limit})
    assert named.status_code == 200 and named.json()["userName"] == at_limit
    renamed = acme.patch(
        f"/Groups/{crew}", {"op": "replace", "path": "displayName", "value": at_limit}
    )
    assert renamed.status_code == 200 and renamed.json()["displayName"] == at_limit
    # A user's displayName is not indexed: it keeps the 4,096 characters of any value.
    long_name = acme.patch(
        f"/Users/{kim}", {"op": "replace", "path": "displayName", "value": over * 6}
    )
    assert long_name.status_code == 200 and long_name.json()["displayName"] == over * 6


def test_on_postgresql_an_unindexable_value_is_400_not_503(
    postgres: Cluster, tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder
) -> None:
    url = postgres.new_database()
    root = copy_data_dir(data_dir, tmp_path / "data")
    settings = make_settings(root, jwks_file, write_policy(tmp_path / "policy"))
    settings = settings.model_copy(update={"database_url": url})
    with TestClient(create_app(settings, embedder=embedder)) as client:
        acme = Scim(client, scim_key(DataLayout(root, url), "acme"))
        # Within the SCIM limit of 4,096 characters, over PostgreSQL's 2,704-byte index entry.
        for value in (noise(4000, 1), cjk(900)):
            refused(acme("POST", "/Users", {"schemas": [USER], "userName": value}), "userName")
            body = {"schemas": [USER], "userName": "pg-ann", "externalId": value}
            refused(acme("POST", "/Users", body), "externalId")
            group = {"schemas": [GROUP], "displayName": value}
            refused(acme("POST", "/Groups", group), "displayName")
        # What the bound lets through, PostgreSQL indexes.
        ann = acme.user(noise(LIMIT, 2), externalId=cjk(666))
        crew = acme.group(noise(LIMIT, 3), ann)
        renamed = acme.patch(
            f"/Groups/{crew}", {"op": "replace", "path": "displayName", "value": cjk(666)}
        )
        assert renamed.status_code == 200, renamed.text
        refused(
            acme.patch(
                f"/Groups/{crew}", {"op": "replace", "path": "displayName", "value": cjk(900)}
            ),
            "displayName",
        )
