"""Methods as HTTP has them (RFC 9110): HEAD wherever GET is served, answered as the GET
without its body (load balancers and monitors probe with it), and a 405 whose `Allow`
names every method served at the path. Also what a 422 says is invalid: the part of the
request its errors are in, not always the body."""

from __future__ import annotations

import http.client
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.embedding import Embedder
from tests.helpers.callers import ALICE, ROOT
from tests.helpers.datadirs import copy_data_dir
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.policies import write_policy
from tests.helpers.processes import running_server, served_env


@pytest.fixture(scope="module")
def admin_client(
    tmp_path_factory: pytest.TempPathFactory, data_dir: Path, jwks_file: Path, embedder: Embedder
) -> Iterator[TestClient]:
    """An app whose policy makes ROOT an admin of acme (the admin routes' checks pass)."""
    policy = write_policy(tmp_path_factory.mktemp("methods-policy"))
    settings = make_settings(data_dir, jwks_file, policy)
    with TestClient(create_app(settings, embedder=embedder)) as served:
        yield served


@pytest.mark.parametrize(
    ("path", "caller"),
    [
        ("/healthz", None),
        ("/readyz", None),
        ("/openapi.json", None),
        ("/documents/refund-policy", ALICE),  # protected: the same checks as its GET
        ("/documents/refund-policy", None),  # 401
        ("/documents/merchant-fraud", ALICE),  # hidden from alice: 404, as for GET
        ("/v1/models", ALICE),
    ],
)
def test_head_is_the_get_without_its_body(
    client: TestClient, make_token: TokenFactory, path: str, caller: dict[str, str] | None
) -> None:
    headers = bearer(make_token(**caller)) if caller is not None else {}
    got = client.get(path, headers=headers)
    head = client.head(path, headers=headers)
    assert head.status_code == got.status_code, (path, head.headers.get("allow"))
    assert head.content == b""
    for name in ("content-type", "content-length", "www-authenticate", "gateway-policy-version"):
        assert head.headers.get(name) == got.headers.get(name), name


@pytest.mark.parametrize("path", ["/search", "/answer", "/mcp"])
def test_head_is_refused_where_get_is(client: TestClient, path: str) -> None:
    head = client.head(path)
    assert head.status_code == 405
    assert head.headers["allow"] == "POST"
    assert head.content == b""


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/scim/v2/Users", "GET, HEAD, POST"),
        ("/scim/v2/Users/someone", "DELETE, GET, HEAD, PATCH, PUT"),
        ("/scim/v2/Groups", "GET, HEAD, POST"),
        ("/scim/v2/Groups/staff", "DELETE, GET, HEAD, PATCH, PUT"),
        # The ACL resource's methods: a DELETE there is the document route's, whose
        # `{doc_id:path}` takes "refund-policy/acl" as another document's ID.
        ("/admin/documents/refund-policy/acl", "PUT"),
        ("/healthz", "GET, HEAD"),
        ("/search", "POST"),
    ],
)
def test_a_405_allows_every_method_served_at_the_path(
    client: TestClient, path: str, allowed: str
) -> None:
    refused = client.options(path)
    assert refused.status_code == 405
    assert refused.headers["allow"] == allowed


def test_a_bad_query_parameter_is_not_blamed_on_the_body(
    admin_client: TestClient, make_token: TokenFactory
) -> None:
    refused = admin_client.get("/admin/audit?limit=abc", headers=bearer(make_token(**ROOT)))
    assert refused.status_code == 422
    problem = refused.json()
    assert problem["detail"] == "the query parameters are invalid"
    assert [e["loc"] for e in problem["errors"]] == [["query", "limit"]]


def test_a_422_names_the_part_of_the_request_at_fault(
    admin_client: TestClient, make_token: TokenFactory
) -> None:
    auth = bearer(make_token(**ROOT))
    body = admin_client.post("/search", json={"query": "refund", "top_k": 0}, headers=auth)
    assert body.status_code == 422
    assert body.json()["detail"] == "the request body is invalid"
    query = admin_client.post("/admin/documents?wait=maybe", json={"documents": []}, headers=auth)
    assert query.status_code == 422
    assert query.json()["detail"] == "the query parameters are invalid"
    assert [e["loc"] for e in query.json()["errors"]] == [["query", "wait"]]


@pytest.mark.server
def test_head_over_real_http_sends_no_body(tmp_path: Path, data_dir: Path, jwks_file: Path) -> None:
    """Through `gateway serve`: the HEAD's headers describe the GET's body, none is sent,
    and the connection goes on (a body sent after a HEAD would be read as the next
    response)."""
    env = served_env(copy_data_dir(data_dir, tmp_path / "data"), jwks_file)
    server: tuple[str, subprocess.Popen[bytes]]
    with running_server(env) as server:
        base, _ = server
        host, port = base.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            connection.request("HEAD", "/readyz")
            head = connection.getresponse()
            assert (head.status, head.read()) == (200, b"")
            connection.request("GET", "/readyz")  # the same connection
            got = connection.getresponse()
            body = got.read()
        finally:
            connection.close()
    assert got.status == 200 and json.loads(body)["status"] == "ready"
    assert head.getheader("content-length") == str(len(body))
    assert head.getheader("content-type") == got.getheader("content-type")
