"""A deleted user's tokens stay refused (403 `account_disabled`) after the identity
provider gives its userName to someone else, whichever attribute tokens name users by
(docs/policy.md, "directory"; docs/security.md, "Deprovisioning is enforced on the next
request"): the tombstone gives up the name, not itself."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.storage.layout import DataLayout
from tests.helpers.datadirs import copy_data_dir
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.policies import write_policy
from tests.helpers.scim import Scim, scim_key

FRAUD = "merchants above MRX-7781"  # finds merchant-fraud, for group:merchant-risk only
# user_attribute: the token claim that names the directory user
CLAIMS = {"userName": "sub", "externalId": "oid", "id": "uid"}


@pytest.fixture(scope="module", params=list(CLAIMS))
def by_attribute(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    data_dir: Path,
    jwks_file: Path,
    embedder: Embedder,
) -> Iterator[tuple[str, TestClient, Scim]]:
    """An app whose policy matches callers to directory users by one attribute."""
    attribute = str(request.param)
    root = copy_data_dir(data_dir, tmp_path_factory.mktemp("tombstones") / "data")
    policy = write_policy(tmp_path_factory.mktemp("policy"))
    written = yaml.safe_load((policy / "policy.yaml").read_text())
    written["directory"] = {"user_claim": CLAIMS[attribute], "user_attribute": attribute}
    (policy / "policy.yaml").write_text(yaml.safe_dump(written))
    with TestClient(create_app(make_settings(root, jwks_file, policy), embedder=embedder)) as c:
        yield attribute, c, Scim(c, scim_key(DataLayout(root), "acme"))


def test_a_deleted_users_tokens_stay_refused_after_its_user_name_is_given_again(
    by_attribute: tuple[str, TestClient, Scim], make_token: TokenFactory
) -> None:
    attribute, client, acme = by_attribute
    claim = CLAIMS[attribute]
    before = int(time.time()) - 120  # issued two minutes ago: past the 30 s leeway

    def token_of(user: dict[str, Any], iat: int | None = None) -> str:
        named = {claim: user[attribute], "iat": iat or int(time.time())}
        return make_token(**{"sub": user["userName"], "groups": ["merchant-risk"], **named})

    def search(token: str) -> Any:
        body = {"query": FRAUD, "top_k": 50}
        return client.post("/search", json=body, headers=bearer(token))

    def refused(token: str) -> bool:
        response = search(token)
        return bool(response.status_code == 403 and response.json()["code"] == "account_disabled")

    # An externalId only where tokens name it: by userName or id, the deleted user has none
    # (its tombstone was once dropped when the name was given again).
    external = {"externalId": "oid-ann-1"} if attribute == "externalId" else {}
    ann = acme("GET", f"/Users/{acme.user('ann-t', **external)}").json()
    acme.group("merchant-risk", ann["id"])
    old = token_of(ann, before)
    assert search(old).status_code == 200
    assert acme("DELETE", f"/Users/{ann['id']}").status_code == 204
    assert refused(old)

    again = {"externalId": "oid-ann-2"} if attribute == "externalId" else {}
    new_ann = acme("GET", f"/Users/{acme.user('ann-t', **again)}").json()
    assert refused(old)  # still the deleted user's token, not a stranger's with its groups
    if attribute != "userName":  # a token naming the deleted user, however new, is its
        assert refused(token_of(ann))
    fresh = search(token_of(new_ann))
    assert fresh.status_code == 200, fresh.text  # the new holder of the name signs in
