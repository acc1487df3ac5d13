"""The admin routes read a JSON body as the push route does: a key given twice is refused
(422 validation_error naming the key) and nothing is changed. Python's parser keeps the
last of two keys silently: `PUT .../acl {"acl": ["group:nobody"], "acl": ["group:staff"]}`
applied staff, while a proxy, a WAF or a reviewer reading the first saw another ACL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.embedding import Embedder
from gateway.ingest.worker import IngestWorker
from tests.helpers.callers import ALICE, ROOT
from tests.helpers.identity import TokenFactory, bearer
from tests.helpers.push_app import push_app
from tests.helpers.scim import USER, scim_key

JSON = {"content-type": "application/json"}


@pytest.fixture
def pushed(
    tmp_path: Path, embedder: Embedder, jwks_file: Path
) -> Iterator[tuple[TestClient, IngestWorker, str]]:
    with push_app(tmp_path, embedder, jwks_file) as app:
        yield app


def refused_for(response: Any, key: str) -> None:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["code"] == "validation_error"
    assert problem["errors"] == [
        {"loc": ["body"], "msg": f"duplicate key '{key}'", "type": "json_invalid"}
    ]


def test_an_acl_given_twice_is_refused_and_the_acl_is_unchanged(
    pushed: tuple[TestClient, IngestWorker, str], make_token: TokenFactory
) -> None:
    client, writer, _ = pushed
    admin, alice = bearer(make_token(**ROOT)), bearer(make_token(**ALICE))
    assert client.get("/documents/merchant-fraud", headers=alice).status_code == 404
    before = writer.catalog.document("acme", "merchant-fraud", "1")
    assert before is not None

    changed = client.put(
        "/admin/documents/merchant-fraud/acl",
        content=b'{"acl": ["group:nobody"], "acl": ["group:staff"]}',
        headers={**admin, **JSON},
    )
    refused_for(changed, "acl")
    assert client.get("/documents/merchant-fraud", headers=alice).status_code == 404
    after = writer.catalog.document("acme", "merchant-fraud", "1")
    assert after is not None and after.visibility.acl == before.visibility.acl

    # Once is fine: the same route, the same ACL, given once.
    once = client.put(
        "/admin/documents/merchant-fraud/acl",
        content=b'{"acl": ["group:staff"]}',
        headers={**admin, **JSON},
    )
    assert once.status_code == 200, once.text
    assert client.get("/documents/merchant-fraud", headers=alice).status_code == 200


@pytest.mark.parametrize(
    ("path", "body", "key"),
    [
        # The claims explain tries, a groups claim given twice (at any depth).
        (
            "/admin/explain",
            b'{"subject": {"sub": "alice", "tenant": "acme", "region": "EU", '
            b'"groups": [], "groups": ["merchant-risk"]}, "doc_id": "merchant-fraud"}',
            "groups",
        ),
        (
            "/admin/policy/preview",
            b'{"files": {"policy.yaml": "{}"}, "files": {"policy.yaml": "{}"}}',
            "files",
        ),
    ],
    ids=["explain", "preview"],
)
def test_the_other_admin_bodies_refuse_a_key_given_twice(
    pushed: tuple[TestClient, IngestWorker, str],
    make_token: TokenFactory,
    path: str,
    body: bytes,
    key: str,
) -> None:
    client, _, _ = pushed
    root = bearer(make_token(**ROOT))
    refused_for(client.post(path, content=body, headers={**root, **JSON}), key)


def test_an_admin_body_nested_too_deeply_is_422_saying_so(
    pushed: tuple[TestClient, IngestWorker, str], make_token: TokenFactory
) -> None:
    """Read as the push route reads its body (`gateway.jsonbody`): found before Python's
    parser recurses into it, and said as such (it was "not UTF-8 JSON")."""
    client, _, _ = pushed
    deep = b'{"subject": ' + b"[" * 1000 + b"]" * 1000 + b', "doc_id": "public"}'
    refused = client.post(
        "/admin/explain", content=deep, headers={**bearer(make_token(**ROOT)), **JSON}
    )
    assert refused.status_code == 422, refused.text
    assert refused.json()["errors"] == [
        {"loc": ["body"], "msg": "JSON nested too deeply", "type": "json_invalid"}
    ]


def test_every_door_refuses_a_key_given_twice(
    pushed: tuple[TestClient, IngestWorker, str], make_token: TokenFactory
) -> None:
    """`/search` with two `top_k`, a chat with two `model`s, a SCIM user with two
    `userName`s: which one the gateway took, no one reading the body could tell."""
    client, writer, _ = pushed
    alice = {**bearer(make_token(**ALICE)), **JSON}
    searched = client.post(
        "/search", content=b'{"query": "refunds", "top_k": 1, "top_k": 50}', headers=alice
    )
    refused_for(searched, "top_k")
    chat = b'{"model": "gateway", "model": "other", "messages": [{"role": "user", "content": "x"}]}'
    chatted = client.post("/v1/chat/completions", content=chat, headers=alice)
    assert chatted.status_code == 400, chatted.text
    assert chatted.json()["error"]["message"] == (
        "the request body is not valid JSON: duplicate key 'model'"
    )
    key = scim_key(writer.layout, "acme")
    user = b'{"schemas": ["%s"], "userName": "ann", "userName": "bob"}' % USER.encode()
    made = client.post(
        "/scim/v2/Users",
        content=user,
        headers={**bearer(key), "content-type": "application/scim+json"},
    )
    assert made.status_code == 400, made.text
    assert made.json()["scimType"] == "invalidSyntax"
    assert "duplicate key 'userName'" in made.json()["detail"]
    listed = client.get("/scim/v2/Users", headers=bearer(key)).json()
    assert listed["totalResults"] == 0  # nothing was created
