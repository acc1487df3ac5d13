"""POST /search through the real app, real engines and real tokens, trying to break it."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.embedding import Embedder
from tests.helpers.callers import ALICE, BOB, CAROL, DAVE, HIDDEN_FROM_ALICE
from tests.helpers.documents import TODAY
from tests.helpers.identity import TokenFactory, bearer


def search(client: TestClient, token: str, query: str, **body: Any) -> Any:
    response = client.post("/search", json={"query": query, **body}, headers=bearer(token))
    assert response.status_code == 200, response.text
    return response.json()


def texts(payload: Any) -> str:
    return "\n".join(r["text"] + r["title"] + r["chunk_id"] for r in payload["results"])


def doc_ids(payload: Any) -> list[str]:
    return [r["doc_id"] for r in payload["results"]]


def test_response_has_the_contract_fields(client: TestClient, make_token: TokenFactory) -> None:
    payload = search(client, make_token(**ALICE), "refund receipt")
    assert set(payload) == {
        "results",
        "degraded",
        "trace_id",
        "policy_version",
        "index_generation",
        "timings_ms",  # an extension of the contract: what `gateway bench` reads per stage
    }
    stages = {"authenticate", "resolve", "restrict", "embed_query", "bm25", "dense", "fuse"}
    assert stages <= set(payload["timings_ms"])
    assert all(ms >= 0 for ms in payload["timings_ms"].values())
    first = payload["results"][0]
    assert set(first) == {"chunk_id", "doc_id", "version", "title", "uri", "score", "text", "lanes"}
    assert set(first["lanes"]) == {"bm25", "dense", "exact"}
    assert first["chunk_id"].startswith(f"{first['doc_id']}@{first['version']}:")
    assert payload["degraded"] == []
    assert len(payload["trace_id"]) == 32 and payload["index_generation"] >= 1


def test_exact_code_is_found_by_bm25(client: TestClient, make_token: TokenFactory) -> None:
    payload = search(client, make_token(**ALICE), "RPL-14", top_k=5)
    top = payload["results"][0]
    assert (top["doc_id"], top["version"]) == ("refund-policy", "2")
    assert top["lanes"]["bm25"] == 1


def test_code_inside_a_question_ranks_its_document_first(
    client: TestClient, make_token: TokenFactory
) -> None:
    payload = search(client, make_token(**ALICE), "What does rule LOY-0001 say about points?")
    top = payload["results"][0]
    assert (top["doc_id"], top["version"]) == ("loyalty", "1")
    assert top["lanes"]["exact"] == 1
    # A question naming no identifier leaves the exact lane silent.
    plain = search(client, make_token(**ALICE), "how are loyalty points earned")
    assert all(r["lanes"]["exact"] is None for r in plain["results"])


def test_paraphrase_without_shared_words_is_found_by_dense(
    client: TestClient, make_token: TokenFactory
) -> None:
    payload = search(
        client,
        make_token(**ALICE),
        "how frequently is telecommuting permitted for personnel",
        top_k=5,
    )
    hit = next(r for r in payload["results"] if r["doc_id"] == "remote-work")
    assert hit["lanes"]["dense"] is not None and hit["lanes"]["bm25"] is None


def test_restricted_code_never_reaches_outsiders(
    client: TestClient, make_token: TokenFactory
) -> None:
    alice = make_token(**ALICE)
    for query in ("MRX-7781", "merchant chargeback threshold suspended", "mrx 7781"):
        assert "MRX-7781" not in texts(search(client, alice, query, top_k=100))
    assert "MRX-7781" in texts(search(client, make_token(**BOB), "MRX-7781", top_k=5))


def test_equal_text_with_other_acl_stays_separate(
    client: TestClient, make_token: TokenFactory
) -> None:
    alice = doc_ids(search(client, make_token(**ALICE), "gift cards expire", top_k=100))
    bob = doc_ids(search(client, make_token(**BOB), "gift cards expire", top_k=100))
    assert "dup-a" in alice and "dup-b" not in alice
    assert {"dup-a", "dup-b"} <= set(bob)


def test_superseded_and_future_versions_are_never_returned(
    client: TestClient, make_token: TokenFactory
) -> None:
    token = make_token(**ALICE)
    payload = search(client, token, "refund paid within days OLDV-1001", top_k=100)
    versions = {(r["doc_id"], r["version"]) for r in payload["results"]}
    assert ("refund-policy", "2") in versions and ("refund-policy", "1") not in versions
    payload = search(client, token, "loyalty points per euro LOY-0002", top_k=100)
    versions = {(r["doc_id"], r["version"]) for r in payload["results"]}
    assert ("loyalty", "1") in versions and ("loyalty", "2") not in versions


def test_boundary_days_are_inclusive(client: TestClient, make_token: TokenFactory) -> None:
    if dt.datetime.now(dt.UTC).date() != TODAY:  # the corpus's "today" is the suite's start
        pytest.skip("the UTC day changed since the corpus was written")
    token = make_token(**ALICE)
    assert "starts-today" in doc_ids(search(client, token, "BND-0101 shift roster"))
    assert "ends-today" in doc_ids(search(client, token, "BND-0202 winter dress code"))
    assert "ended-yesterday" not in doc_ids(
        search(client, token, "BND-0303 old parking rule", top_k=100)
    )


def test_other_tenant_and_region_are_invisible(
    client: TestClient, make_token: TokenFactory
) -> None:
    alice = make_token(**ALICE)
    assert "USR-5150" not in texts(search(client, alice, "USR-5150 Thanksgiving", top_k=100))
    assert "GLX-9000" not in texts(search(client, alice, "GLX-9000 price matching", top_k=100))
    assert "USR-5150" in texts(search(client, make_token(**CAROL), "USR-5150"))
    dave = search(client, make_token(**DAVE), "refund rule price", top_k=100)
    assert doc_ids(dave) == ["globex-pricing"]


def test_whether_some_acl_names_my_group_does_not_show(
    client: TestClient, make_token: TokenFactory
) -> None:
    """Only acme's documents name group:merchant-risk. A caller of another tenant holding
    it, and one holding a group no ACL names, both see nothing, through the same stages:
    stopping early for the second told them apart (`timings_ms` had no lane stages)."""
    named = search(
        client, make_token(sub="ivan", tenant="initech", groups=["merchant-risk"]), "fee"
    )
    unnamed = search(client, make_token(sub="ivan", tenant="initech", groups=["no-acl"]), "fee")
    assert named["results"] == unnamed["results"] == []
    assert {"bm25", "dense"} <= set(unnamed["timings_ms"])
    assert set(named["timings_ms"]) == set(unnamed["timings_ms"])


def test_caller_without_matching_principals_sees_nothing(
    client: TestClient, make_token: TokenFactory
) -> None:
    payload = search(client, make_token(sub="nobody", groups=[]), "refund RPL-14", top_k=100)
    assert payload["results"] == []
    payload = search(client, make_token(sub="x", groups="staff"), "refund", top_k=100)
    assert payload["results"] == []  # a non-list groups claim grants nothing


def test_group_names_with_quotes_work(client: TestClient, make_token: TokenFactory) -> None:
    token = make_token(sub="q", groups=['o\'brien "team"'])
    assert doc_ids(search(client, token, "QTE-4242 inventory ledger")) == ["quoted-team"]


HOSTILE = [
    "*",
    "acl:x",
    "acl:group:merchant-risk",
    "title:(a",
    '"unbalanced',
    "' OR 1=1 --",
    "tenant = 'acme' OR 1=1",
    "region:US OR tenant:globex",
    "MRX-7781 OR *:*",
    "\\",
    "()",
    "🙂💥 refund 🙂",
    "NOT refund",
    "a" * 2000,
    "refund " * 285,
    "\x00 refund",
    "%s%s%n",
    "group:merchant-risk MRX-7781",
    "[* TO *]",
    "effective_from:[0 TO 99999999]",
]


@pytest.mark.parametrize("query", HOSTILE)
def test_hostile_queries_never_widen_the_universe(
    client: TestClient, make_token: TokenFactory, query: str
) -> None:
    response = client.post(
        "/search", json={"query": query, "top_k": 100}, headers=bearer(make_token(**ALICE))
    )
    assert response.status_code in (200, 422), response.text
    if response.status_code == 200:
        found = texts(response.json())
        assert not any(code in found for code in HIDDEN_FROM_ALICE)


@pytest.mark.parametrize(
    "body",
    [
        {"query": "x" * 2001},
        {"query": ""},
        {"query": "a", "top_k": 0},
        {"query": "a", "top_k": 101},
        {"query": "a", "group_by": "tenant"},
        {"top_k": 5},
        {"query": "a", "bypass": True},
    ],
)
def test_invalid_requests_are_422_problems(
    client: TestClient, make_token: TokenFactory, body: dict[str, Any]
) -> None:
    response = client.post("/search", json=body, headers=bearer(make_token(**ALICE)))
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "validation_error"


def test_top_k_up_to_100_and_group_by_document(
    client: TestClient, make_token: TokenFactory
) -> None:
    token = make_token(**ALICE)
    chunks = search(client, token, "store staff rule", top_k=100)
    assert 1 <= len(chunks["results"]) <= 100
    docs = search(client, token, "store staff rule", top_k=100, group_by="document")
    ids = doc_ids(docs)
    assert len(ids) == len(set(ids)) and set(ids) == set(doc_ids(chunks))


def test_missing_claims_is_403(client: TestClient, make_token: TokenFactory) -> None:
    response = client.post(
        "/search", json={"query": "refund"}, headers=bearer(make_token(tenant=None))
    )
    assert response.status_code == 403
    assert response.json()["code"] == "insufficient_claims"


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer garbage"},
        {"Authorization": "Basic YWxpY2U6cHc="},
        {"Authorization": "Bearer a.b.c"},
    ],
)
def test_missing_or_malformed_token_is_401(client: TestClient, headers: dict[str, str]) -> None:
    response = client.post("/search", json={"query": "refund"}, headers=headers)
    assert response.status_code == 401
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.headers["www-authenticate"] == "Bearer"


def test_expired_and_misaddressed_tokens_are_401(
    client: TestClient, make_token: TokenFactory
) -> None:
    for token in (
        make_token(ttl=-3600),
        make_token(aud="someone-else"),
        make_token(iss="https://evil.test"),
    ):
        response = client.post("/search", json={"query": "refund"}, headers=bearer(token))
        assert response.status_code == 401


def test_health_and_readiness_are_public(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


def test_a_colleagues_question_is_never_served_from_the_cache(
    client: TestClient, make_token: TokenFactory, embedder: Embedder
) -> None:
    """`timings_ms.embed_query` shows a cache hit; a hit must only ever come from the
    caller's own earlier question, never a colleague's in the same tenant."""
    query = "which rule did my colleague just look up"
    before = embedder._embed_query_cached.cache_info()
    for token in (make_token(sub="alice"), make_token(sub="alice"), make_token(sub="bob")):
        search(client, token, query)
    after = embedder._embed_query_cached.cache_info()
    # alice: a miss, then her own hit; bob, same tenant, same groups: a miss of his own.
    assert (after.misses - before.misses, after.hits - before.hits) == (2, 1)
