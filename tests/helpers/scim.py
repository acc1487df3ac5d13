"""A SCIM client for in-process tests (a TestClient and a `scim` key of one tenant)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.authn.apikeys import create_key
from gateway.embedding import Embedder
from gateway.storage.layout import DataLayout
from tests.helpers.datadirs import copy_data_dir
from tests.helpers.identity import bearer, make_settings
from tests.helpers.policies import write_policy

USER = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP = "urn:ietf:params:scim:schemas:core:2.0:Group"
PATCH = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
ERROR = "urn:ietf:params:scim:api:messages:2.0:Error"
SCIM_JSON = "application/scim+json"


class Scim:
    def __init__(self, client: TestClient, key: str) -> None:
        self.client, self.headers = client, bearer(key)

    def __call__(self, method: str, path: str, body: Any = None) -> Any:
        response = self.client.request(method, f"/scim/v2{path}", json=body, headers=self.headers)
        if response.status_code != 204:
            assert response.headers["content-type"].startswith(SCIM_JSON), response.text
        return response

    def user(self, user_name: str, **extra: Any) -> str:
        made = self("POST", "/Users", {"schemas": [USER], "userName": user_name, **extra})
        assert made.status_code == 201, made.text
        return str(made.json()["id"])

    def group(self, name: str, *members: str) -> str:
        body = {"schemas": [GROUP], "displayName": name, "members": [{"value": m} for m in members]}
        made = self("POST", "/Groups", body)
        assert made.status_code == 201, made.text
        return str(made.json()["id"])

    def patch(self, path: str, *operations: dict[str, Any]) -> Any:
        return self("PATCH", path, {"schemas": [PATCH], "Operations": list(operations)})

    def everything(self) -> Any:
        users = self("GET", "/Users?count=1000").json()
        groups = self("GET", "/Groups?count=1000").json()
        for listed in (users, groups):
            for resource in listed["Resources"]:
                resource["meta"].pop("location")
        return users, groups


def scim_key(layout: DataLayout, tenant: str) -> str:
    key, _ = create_key(
        layout.open_catalog(), tenant=tenant, region="", principals=[], scope="scim"
    )
    return key


@contextmanager
def scim_app(
    tmp_path_factory: pytest.TempPathFactory, data_dir: Path, jwks_file: Path, embedder: Embedder
) -> Iterator[tuple[TestClient, DataLayout]]:
    """An in-process app on a copy of the shared data dir, with the tests' policy."""
    root = copy_data_dir(data_dir, tmp_path_factory.mktemp("scim") / "data")
    policy = write_policy(tmp_path_factory.mktemp("policy"))
    with TestClient(create_app(make_settings(root, jwks_file, policy), embedder=embedder)) as c:
        yield c, DataLayout(root)
