"""Hundreds of random callers, queries and routes: nothing outside the caller's universe, ever.

Each response is checked against the reference predicate on the catalog's own metadata:
every returned or cited chunk must be visible to the caller today, and no code of a
document it may not see may appear anywhere in the response body.
"""

from __future__ import annotations

import random
import re
from typing import Any
from urllib.parse import quote

from fastapi.testclient import TestClient

from gateway.policy.loader import load_policy
from gateway.policy.resolve import resolve_caller
from gateway.restriction import Restriction, visible
from gateway.retrieval.search import today_utc
from gateway.storage.catalog import Catalog
from tests.helpers.documents import CORPUS
from tests.helpers.identity import TokenFactory, bearer

REQUESTS = 300
CODE = re.compile(r"\b[A-Z]{3,4}-\d{1,4}\b")
GROUPS = ["staff", "merchant-risk", 'o\'brien "team"', "STAFF", "staff ", "*", ""]
WORDS = ["refund", "loyalty points", "chargeback", "gift cards", "price", "shift", "dress code"]
HOSTILE = ["*", "acl:*", "tenant:globex", "' OR 1=1 --", "title:(a", '"', "\\", "%", "_"]


def codes_by_doc() -> dict[tuple[str, str], set[str]]:
    found: dict[tuple[str, str], set[str]] = {}
    for _name, meta, body in CORPUS:
        key = (meta["doc_id"], str(meta.get("version", "1")))
        found.setdefault(key, set()).update(CODE.findall(body))
    return found


def random_caller(rng: random.Random) -> dict[str, Any]:
    return {
        "sub": rng.choice(["alice", "bob", "zed", "user:alice", "admin"]),
        "tenant": rng.choice(["acme", "acme", "globex", "ACME", "other"]),
        "region": rng.choice(["EU", "EU", "US", "APAC", "GLOBAL", "eu"]),
        "groups": rng.sample(GROUPS, rng.randint(0, 3)),
    }


def random_query(rng: random.Random, codes: list[str]) -> str:
    parts = rng.sample(codes, rng.randint(0, 2)) + rng.sample(WORDS, rng.randint(0, 2))
    parts += rng.sample(HOSTILE, rng.randint(0, 1))
    return " ".join(parts) or rng.choice(codes)


def test_no_response_ever_leaves_the_callers_universe(
    client: TestClient, make_token: TokenFactory, data_dir: Any
) -> None:
    rng = random.Random(20261122)
    catalog = Catalog(data_dir / "catalog.db")
    policy = load_policy(None).policy
    codes = codes_by_doc()
    all_codes = sorted({c for found in codes.values() for c in found})
    statuses: dict[int, int] = {}
    for _ in range(REQUESTS):
        claims = random_caller(rng)
        caller = resolve_caller(claims, policy)
        restriction = Restriction.for_caller(caller, today_utc())
        hidden_codes = {
            code
            for (doc_id, version), found in codes.items()
            for code in found
            if not _visible(catalog, restriction, doc_id, version)
        } - _visible_codes(catalog, restriction, codes)
        response = _random_request(client, rng, make_token(**claims), all_codes)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        assert response.status_code in (200, 404, 422), response.text
        leaked = [code for code in hidden_codes if code in response.text]
        assert not leaked, (claims, response.request.url, leaked)
        if response.status_code == 200:
            for chunk_id in _chunk_ids(response.json()):
                doc_id, _, rest = chunk_id.partition("@")
                version = rest.partition(":")[0]
                assert _visible(catalog, restriction, doc_id, version), (caller, chunk_id)
    assert statuses.get(200, 0) > REQUESTS // 2  # the fuzz mostly exercised real answers


def _visible(catalog: Catalog, restriction: Restriction, doc_id: str, version: str) -> bool:
    row = catalog.document(restriction.tenant, doc_id, version)
    return row is not None and visible(restriction, row.visibility)


def _visible_codes(
    catalog: Catalog, restriction: Restriction, codes: dict[tuple[str, str], set[str]]
) -> set[str]:
    """Codes the caller may legitimately see (the same code can sit in two documents)."""
    return {
        code
        for (doc_id, version), found in codes.items()
        if _visible(catalog, restriction, doc_id, version)
        for code in found
    }


def _random_request(client: TestClient, rng: random.Random, token: str, codes: list[str]) -> Any:
    headers = bearer(token)
    route = rng.choice(["search", "search", "answer", "answer", "document", "chunk"])
    if route == "search":
        body = {
            "query": random_query(rng, codes),
            "top_k": rng.choice([1, 10, 100]),
            "group_by": rng.choice(["chunk", "document"]),
        }
        return client.post("/search", json=body, headers=headers)
    if route == "answer":
        return client.post("/answer", json={"query": random_query(rng, codes)}, headers=headers)
    doc_id = rng.choice([meta["doc_id"] for _n, meta, _b in CORPUS] + ["missing"])
    if route == "document":
        return client.get(f"/documents/{quote(doc_id, safe='')}", headers=headers)
    chunk_id = f"{doc_id}@{rng.choice(['1', '2', '9'])}:{rng.choice([0, 1])}"
    return client.get(f"/chunks/{quote(chunk_id, safe='')}", headers=headers)


def _chunk_ids(payload: Any) -> list[str]:
    if "results" in payload:
        return [r["chunk_id"] for r in payload["results"]]
    if "citations" in payload:
        return [c["chunk_id"] for c in payload["citations"]]
    if "chunk_ids" in payload:
        return list(payload["chunk_ids"])
    return [payload["chunk_id"]] if "chunk_id" in payload else []
