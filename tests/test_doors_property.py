"""One pipeline, three protocols: for generated callers and queries over a generated corpus,
MCP `search` returns exactly what /search returns the same caller, and the chat endpoint
cites exactly what /answer cites, so no door shows anything another would not.

The corpus (tenants, regions, ACLs, dates that have not started or have ended, a unique
code per document) is drawn once per module from a seeded generator: ingesting it again for
each Hypothesis example would cost the embedding every time. Callers and queries are
Hypothesis' to draw, and to shrink.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.storage.layout import DataLayout
from tests.helpers.documents import write_doc
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.mcp import call_tool
from tests.helpers.policies import policy_with_budgets
from tests.helpers.properties import examples

DOCUMENTS = 24
TENANTS = ["acme", "globex"]
REGIONS = ["EU", "US", "GLOBAL"]
GROUPS = ["a", "b", "c", "staff"]
WORDS = ["refund", "pelican quota", "loyalty points", "shift roster", "gift cards", "audit"]
CODES = [f"QZ-{i:03d}" for i in range(DOCUMENTS)]


def generated_corpus(root: Path) -> Path:
    rng = random.Random(29)
    today = dt.datetime.now(dt.UTC).date()
    for i, code in enumerate(CODES):
        start = today + dt.timedelta(days=rng.choice([-400, -30, -1, 0, 1, 30]))
        meta: dict[str, Any] = {
            "doc_id": f"gen-{i}",
            "title": f"Generated note {i}",
            "tenant": rng.choice(TENANTS),
            "region": rng.choice(REGIONS),
            "acl": [f"group:{g}" for g in rng.sample(GROUPS, rng.randint(1, 2))],
            "effective_from": start.isoformat(),
        }
        if rng.random() < 0.2:
            meta["effective_to"] = (start + dt.timedelta(days=rng.choice([0, 1, 10]))).isoformat()
        topics = " and ".join(rng.sample(WORDS, 2))
        body = f"# Note {i}\n\nThe rule {code} covers {topics}. It applies to every {topics}."
        write_doc(root, f"gen-{i}.md", meta, body)
    return root


@pytest.fixture(scope="module")
def doors(
    tmp_path_factory: pytest.TempPathFactory, jwks_file: Path, embedder: Embedder
) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("doors")
    layout = DataLayout(root / "data")
    ingest_paths([generated_corpus(root / "corpus")], layout, embedder)
    # Budgets no lane misses on a busy machine: a lane that answered one door and not the
    # other (degraded) would differ for time, not for permissions.
    policy = policy_with_budgets(root, bm25_ms=30_000, dense_ms=30_000, exact_ms=30_000)
    with TestClient(
        create_app(make_settings(layout.root, jwks_file, policy), embedder=embedder)
    ) as c:
        yield c


callers = st.fixed_dictionaries(
    {
        "sub": st.sampled_from(["ann", "ben", "cy"]),
        "tenant": st.sampled_from([*TENANTS, "other"]),
        "region": st.sampled_from([*REGIONS, "APAC"]),
        "groups": st.lists(st.sampled_from(GROUPS), max_size=3, unique=True),
    }
)
queries = st.lists(st.sampled_from(CODES + WORDS), min_size=1, max_size=3).map(" ".join)


@settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(claims=callers, query=queries, top_k=st.integers(min_value=1, max_value=20))
def test_mcp_search_and_chat_citations_are_search_and_answer(
    doors: TestClient, make_token: TokenFactory, claims: dict[str, Any], query: str, top_k: int
) -> None:
    token = make_token(**claims)
    searched = doors.post("/search", json={"query": query, "top_k": top_k}, headers=bearer(token))
    assert searched.status_code == 200, searched.text
    tool = call_tool(doors, token, "search", query=query, top_k=top_k)
    assert not tool["isError"]
    assert [h["id"] for h in tool["structuredContent"]["results"]] == [
        r["chunk_id"] for r in searched.json()["results"]
    ]
    answered = doors.post("/answer", json={"query": query}, headers=bearer(token)).json()
    chat = doors.post(
        "/v1/chat/completions",
        json={"model": "gateway", "messages": [{"role": "user", "content": query}]},
        headers=bearer(token),
    )
    assert chat.status_code == 200, chat.text
    completion = chat.json()
    assert completion["citations"] == answered["citations"]
    assert completion["gateway"]["abstained"] == answered["abstained"]
    event("found something" if searched.json()["results"] else "found nothing")
    event("answered" if not answered["abstained"] else "abstained")
    if not answered["abstained"]:
        assert completion["choices"][0]["message"]["content"] == answered["answer"]
