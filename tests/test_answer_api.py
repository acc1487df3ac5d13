"""POST /answer, GET /documents and GET /chunks through the real app, trying to make them leak."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.embedding import Embedder
from tests.helpers.callers import ALICE, BOB, CAROL, DAVE, HIDDEN_FROM_ALICE
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.policies import TOO_SHORT_MS, policy_with_budgets
from tests.helpers.tracing import STAGES

MARKER = re.compile(r"\[(\d+)\]")


def ask(client: TestClient, token: str, query: str, **body: Any) -> Any:
    response = client.post("/answer", json={"query": query, **body}, headers=bearer(token))
    assert response.status_code == 200, response.text
    return response.json()


def cited_chunks(payload: Any) -> set[str]:
    return {c["chunk_id"] for c in payload["citations"]}


def assert_grounded(payload: Any) -> None:
    """A non-abstained answer cites, and every [n] in its text is one of its citations."""
    numbers = {c["n"] for c in payload["citations"]}
    if payload["abstained"]:
        assert payload["answer"] == "" and payload["citations"] == []
        assert payload["abstain_reason"] in {"no_permitted_evidence", "insufficient_evidence"}
        return
    assert payload["abstain_reason"] is None and payload["citations"]
    shown = {int(n) for n in MARKER.findall(payload["answer"])}
    assert shown == numbers == set(range(1, len(numbers) + 1))
    assert len(payload["answer"].split()) <= 80


def test_response_has_the_contract_fields(client: TestClient, make_token: TokenFactory) -> None:
    payload = ask(client, make_token(**ALICE), "How quickly are refunds paid?")
    assert set(payload) == {
        "answer",
        "abstained",
        "abstain_reason",
        "citations",
        "degraded",
        "truncated",
        "trace_id",
        "policy_version",
        "index_generation",
        "timings_ms",
    }
    assert set(payload["citations"][0]) == {"n", "chunk_id", "doc_id", "version", "title", "uri"}
    assert set(payload["timings_ms"]) >= STAGES
    assert all(ms >= 0 for ms in payload["timings_ms"].values())
    assert len(payload["trace_id"]) == 32 and payload["degraded"] == []


def test_answers_from_the_current_version_with_its_citation(
    client: TestClient, make_token: TokenFactory
) -> None:
    payload = ask(client, make_token(**ALICE), "How quickly are refunds paid?")
    assert_grounded(payload)
    assert "5 days" in payload["answer"] and "30 days" not in payload["answer"]
    assert "refund-policy@2:0" in cited_chunks(payload)
    assert all(c["version"] == "2" for c in payload["citations"] if c["doc_id"] == "refund-policy")


def test_answer_is_a_few_sentences_not_whole_passages(
    client: TestClient, make_token: TokenFactory
) -> None:
    payload = ask(client, make_token(**ALICE), "How many days a week may employees work from home?")
    assert_grounded(payload)
    assert "three days per week" in payload["answer"]
    assert "remote-work" in {c["doc_id"] for c in payload["citations"]}
    # Not the store notes that merely share words with the question.
    assert "Fire exits" not in payload["answer"]


@pytest.mark.parametrize("code", HIDDEN_FROM_ALICE)
def test_hidden_codes_are_never_quoted_or_cited(
    client: TestClient, make_token: TokenFactory, code: str
) -> None:
    for query in (code, f"What does rule {code} say?", f"Explain {code} in detail please"):
        payload = ask(client, make_token(**ALICE), query)
        assert_grounded(payload)
        assert code not in payload["answer"]
        hidden_docs = {"merchant-fraud", "us-holidays", "globex-pricing", "quoted-team"}
        assert not hidden_docs & {c["doc_id"] for c in payload["citations"]}
        assert "refund-policy@1:0" not in cited_chunks(payload)
        assert not any(
            c.startswith(("loyalty@2", "ended-yesterday")) for c in cited_chunks(payload)
        )


def test_the_permitted_caller_gets_the_restricted_rule(
    client: TestClient, make_token: TokenFactory
) -> None:
    query = "What happens to merchants above the chargeback threshold?"
    insider = ask(client, make_token(**BOB), query)
    assert_grounded(insider)
    assert "MRX-7781" in insider["answer"]
    assert "merchant-fraud" in {c["doc_id"] for c in insider["citations"]}
    outsider = ask(client, make_token(**ALICE), query)
    assert "MRX-7781" not in outsider["answer"]
    assert "merchant-fraud" not in {c["doc_id"] for c in outsider["citations"]}


def test_other_tenant_and_region_answer_from_their_own_documents(
    client: TestClient, make_token: TokenFactory
) -> None:
    globex = ask(client, make_token(**DAVE), "How does price matching work?")
    assert_grounded(globex)
    assert {c["doc_id"] for c in globex["citations"]} == {"globex-pricing"}
    acme = ask(client, make_token(**ALICE), "How does price matching work?")
    assert "GLX-9000" not in acme["answer"]
    assert "globex-pricing" not in {c["doc_id"] for c in acme["citations"]}
    us = ask(client, make_token(**CAROL), "When do stores close on Thanksgiving?")
    assert_grounded(us)
    assert {c["doc_id"] for c in us["citations"]} == {"us-holidays"}


def test_caller_without_matching_principals_abstains(
    client: TestClient, make_token: TokenFactory
) -> None:
    for query in ("How quickly are refunds paid?", "RPL-14", "gift cards"):
        payload = ask(client, make_token(sub="zed", groups=[]), query)
        assert payload["abstained"] is True
        assert payload["abstain_reason"] == "no_permitted_evidence"
        assert payload["answer"] == "" and payload["citations"] == []


def test_off_topic_question_abstains(client: TestClient, make_token: TokenFactory) -> None:
    for query in (
        "What is the boiling point of liquid nitrogen?",
        "Who won the football world cup in 1998?",
    ):
        payload = ask(client, make_token(**ALICE), query)
        assert payload["abstained"] is True, payload["answer"]
        # Permitted chunks were ranked (the dense lane always finds neighbours), none fit.
        assert payload["abstain_reason"] == "insufficient_evidence"
        assert payload["answer"] == "" and payload["citations"] == []


@pytest.mark.parametrize(
    "query",
    ["*", "acl:x OR tenant:globex", "title:(a", '"unclosed', "'; DROP TABLE chunks; --", "🦜" * 40],
)
def test_hostile_queries_answer_within_the_universe(
    client: TestClient, make_token: TokenFactory, query: str
) -> None:
    payload = ask(client, make_token(**ALICE), query)
    assert_grounded(payload)
    assert not any(code in payload["answer"] for code in HIDDEN_FROM_ALICE)


@pytest.mark.parametrize(
    "body",
    [{}, {"query": ""}, {"query": "x" * 2001}, {"query": "a", "top_k": 0}, {"query": "a", "x": 1}],
)
def test_invalid_answer_requests_are_422_problems(
    client: TestClient, make_token: TokenFactory, body: dict[str, Any]
) -> None:
    response = client.post("/answer", json=body, headers=bearer(make_token()))
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/problem+json")


def test_answer_requires_a_token(client: TestClient) -> None:
    response = client.post("/answer", json={"query": "refunds"})
    assert response.status_code == 401
    assert response.headers["content-type"].startswith("application/problem+json")


def test_answer_with_one_lane_past_budget_is_degraded(
    tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    policy = policy_with_budgets(tmp_path, dense_ms=TOO_SHORT_MS)
    with TestClient(create_app(make_settings(data_dir, jwks_file, policy), embedder=embedder)) as c:
        payload = ask(c, make_token(**ALICE), "RPL-14 refund")
        assert payload["degraded"] == ["dense"]
        assert "refund-policy@2:0" in cited_chunks(payload)
        both = policy_with_budgets(tmp_path, dense_ms=TOO_SHORT_MS, bm25_ms=TOO_SHORT_MS)
    with TestClient(create_app(make_settings(data_dir, jwks_file, both), embedder=embedder)) as c:
        response = c.post("/answer", json={"query": "refund"}, headers=bearer(make_token()))
        assert response.status_code == 503
        assert response.json()["code"] == "lanes_unavailable"


# -- documents and chunks by ID ---------------------------------------------------------------


def get(client: TestClient, token: str, path: str) -> Any:
    return client.get(path, headers=bearer(token))


def test_document_shows_the_version_in_force(client: TestClient, make_token: TokenFactory) -> None:
    response = get(client, make_token(**ALICE), "/documents/refund-policy")
    assert response.status_code == 200
    doc = response.json()
    assert (doc["doc_id"], doc["version"]) == ("refund-policy", "2")
    assert "RPL-14" in doc["text"] and doc["chunk_ids"] == ["refund-policy@2:0"]
    loyalty = get(client, make_token(**ALICE), "/documents/loyalty").json()
    assert loyalty["version"] == "1" and "LOY-0002" not in loyalty["text"]


def test_invisible_documents_look_exactly_like_missing_ones(
    client: TestClient, make_token: TokenFactory
) -> None:
    token = make_token(**ALICE)
    missing = get(client, token, "/documents/no-such-document")
    assert missing.status_code == 404
    for doc_id in ("merchant-fraud", "us-holidays", "globex-pricing", "ended-yesterday"):
        hidden = get(client, token, f"/documents/{doc_id}")
        assert hidden.status_code == 404
        assert hidden.content == missing.content
        assert hidden.headers["content-type"] == missing.headers["content-type"]
    assert get(client, make_token(**BOB), "/documents/merchant-fraud").status_code == 200
    nobody = get(client, make_token(sub="zed", groups=[]), "/documents/refund-policy")
    assert nobody.status_code == 404 and nobody.content == missing.content


def test_chunk_by_url_encoded_id(client: TestClient, make_token: TokenFactory) -> None:
    response = get(client, make_token(**ALICE), "/chunks/" + quote("refund-policy@2:0", safe=""))
    assert response.status_code == 200
    chunk = response.json()
    assert (chunk["chunk_id"], chunk["version"], chunk["ordinal"]) == ("refund-policy@2:0", "2", 0)
    assert "RPL-14" in chunk["text"] and chunk["token_count"] > 0


def test_invisible_chunks_look_exactly_like_missing_ones(
    client: TestClient, make_token: TokenFactory
) -> None:
    token = make_token(**ALICE)
    missing = get(client, token, "/chunks/" + quote("refund-policy@9:0", safe=""))
    assert missing.status_code == 404
    for chunk_id in (
        "refund-policy@1:0",  # superseded
        "loyalty@2:0",  # not yet in force
        "merchant-fraud@1:0",  # outside the ACL
        "globex-pricing@1:0",  # another tenant
        "refund-policy@2:7",  # no such ordinal
        "not a chunk id",
    ):
        hidden = get(client, token, "/chunks/" + quote(chunk_id, safe=""))
        assert hidden.status_code == 404, chunk_id
        assert hidden.content == missing.content
