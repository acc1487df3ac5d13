"""The demo a newcomer runs: its corpus, its issuer, and the story README.md, "The demo" tells."""

from __future__ import annotations

import datetime as dt
import re
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.authn.devissuer import DevIssuer, ensure_dev_issuer
from gateway.demo import run
from gateway.embedding import Embedder
from gateway.ingest.sources import load_documents
from gateway.settings import Settings
from tests.helpers.identity import bearer, make_settings


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Path:
    data_dir = tmp_path_factory.mktemp("demo")
    assert run.prepare_data(data_dir, embedder, progress=False) is not None
    return data_dir


@pytest.fixture(scope="module")
def demo_client(demo_dir: Path, embedder: Embedder) -> Iterator[TestClient]:
    settings = run.demo_settings(Settings(), demo_dir)
    with TestClient(create_app(settings, embedder=embedder)) as client:
        yield client


@pytest.fixture(scope="module")
def tokens(demo_dir: Path) -> dict[str, str]:
    return {c.name: t for c, t in run.mint_tokens(ensure_dev_issuer(demo_dir)).items()}


def ask(client: TestClient, token: str, query: str) -> Any:
    response = client.post("/answer", json={"query": query}, headers=bearer(token))
    assert response.status_code == 200, response.text
    return response.json()


def test_corpus_is_a_retailer_with_regions_teams_and_versions() -> None:
    documents = load_documents([run.CORPUS_DIR])
    assert len(documents) >= 60
    assert {d.visibility.region for d in documents} >= {"EU", "US", "APAC", "GLOBAL"}
    assert len({a for d in documents for a in d.visibility.acl}) >= 6
    today = dt.datetime.now(dt.UTC).date()
    assert any(d.visibility.effective_from > today for d in documents), "a future version"
    versions: dict[str, int] = {}
    for d in documents:
        versions[d.doc_id] = versions.get(d.doc_id, 0) + 1
    assert sum(n > 1 for n in versions.values()) >= 8, "superseded versions"
    restricted = [d for d in documents if "group:merchant-risk" in d.visibility.acl]
    assert len(restricted) >= 5


def test_second_start_does_not_ingest_again(demo_dir: Path, embedder: Embedder) -> None:
    assert run.prepare_data(demo_dir, embedder, progress=False) is None


def test_three_callers_one_question_three_permitted_answers(
    demo_client: TestClient, tokens: dict[str, str]
) -> None:
    expected = {
        "ana": ("returns-eu", "2", "30 days"),
        "ben": ("returns-us", "2", "60 days"),
        "chen": ("returns-apac", "1", "14 days"),  # version 2 (21 days) is not in force yet
    }
    answers = set()
    for name, (doc_id, version, phrase) in expected.items():
        payload = ask(demo_client, tokens[name], run.SAME_QUESTION)
        assert not payload["abstained"]
        assert phrase in payload["answer"]
        cited = {(c["doc_id"], c["version"]) for c in payload["citations"]}
        assert (doc_id, version) in cited
        assert all(c["doc_id"] == doc_id for c in payload["citations"]), cited
        answers.add(payload["answer"])
    assert len(answers) == 3


def test_restricted_code_is_an_abstention(demo_client: TestClient, tokens: dict[str, str]) -> None:
    payload = ask(demo_client, tokens["ana"], run.RESTRICTED_QUESTION)
    assert payload["abstained"] is True and payload["citations"] == []
    assert "MRC" not in payload["answer"]


def test_dev_issuer_is_refused_unless_enabled(
    demo_dir: Path, embedder: Embedder, tokens: dict[str, str], jwks_file: Path
) -> None:
    # A deployment with its own issuer never trusts the demo's key, even in the same data dir.
    with TestClient(create_app(make_settings(demo_dir, jwks_file), embedder=embedder)) as c:
        response = c.post("/search", json={"query": "returns"}, headers=bearer(tokens["ana"]))
        assert response.status_code == 401
    settings = Settings(data_dir=demo_dir, dev_issuer=False)
    with TestClient(create_app(settings, embedder=embedder)) as c:
        response = c.post("/search", json={"query": "returns"}, headers=bearer(tokens["ana"]))
        assert response.status_code == 401
    with TestClient(
        create_app(settings.model_copy(update={"dev_issuer": True}), embedder=embedder)
    ) as c:
        response = c.post("/search", json={"query": "returns"}, headers=bearer(tokens["ana"]))
        assert response.status_code == 200


def test_dev_issuer_key_is_private_and_stable(demo_dir: Path) -> None:
    first: DevIssuer = ensure_dev_issuer(demo_dir)
    key_file = demo_dir / "dev-issuer" / "signing-key.pem"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert ensure_dev_issuer(demo_dir).key.public_jwk() == first.key.public_jwk()


def test_instructions_give_tokens_and_commands(demo_dir: Path, tokens: dict[str, str]) -> None:
    minted = run.mint_tokens(ensure_dev_issuer(demo_dir))
    env_file = run.write_env(demo_dir, minted)
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    text = run.instructions("http://127.0.0.1:8080", minted, env_file)
    for caller, token in minted.items():
        assert f"export {caller.variable}={token}" in text
        assert f"Bearer ${caller.variable}" in text
    assert text.count("curl -s http://127.0.0.1:8080/answer") == 4
    assert run.RESTRICTED_QUESTION in text and str(env_file) in text
    (admin,) = [c for c in minted if c.admin]
    console = text.split("# The console, as ", 1)[1]
    assert console.startswith(admin.name) and "http://127.0.0.1:8080/console" in console
    assert minted[admin] in console.splitlines()  # on a line of its own, to paste


def test_the_demo_names_an_admin_who_may_use_the_console(
    demo_client: TestClient, tokens: dict[str, str]
) -> None:
    admins = [c.name for c in run.CALLERS if c.admin]
    assert admins == ["dana"]
    for name, token in tokens.items():
        status = demo_client.get("/admin/index", headers=bearer(token)).status_code
        assert status == (200 if name in admins else 403), name
    explained = demo_client.post(
        "/admin/explain",
        json={
            "subject": {"sub": "ana", "tenant": "northwind", "region": "EU", "groups": ["staff"]},
            "doc_id": "merchant-chargeback-limits-eu",
        },
        headers=bearer(tokens["dana"]),
    )
    assert explained.status_code == 200 and explained.json()["visible"] is False


# README.md, "The demo" quotes the demo; these keep every figure it quotes equal to what the
# demo does.
README = Path(__file__).resolve().parents[1] / "README.md"
CALLER_ROW = re.compile(r"^\| (\w+), [^|]+ \| ([^|]+?) \| ([^|]+?) \|$", re.M)  # three columns


def readme_demo_table() -> dict[str, tuple[str, list[str]]]:
    """caller -> (answer, cited chunk IDs) from the three-callers table of README.md, "The demo"."""
    rows = {
        name: (answer, re.findall(r"`([^`]+)`", cites))
        for name, answer, cites in CALLER_ROW.findall(README.read_text())
    }
    assert set(rows) == {"ana", "ben", "chen"}, "the README's demo table was not found"
    return rows


def test_readme_demo_answers_are_the_demos(demo_client: TestClient, tokens: dict[str, str]) -> None:
    for name, (answer, cited) in readme_demo_table().items():
        payload = ask(demo_client, tokens[name], run.SAME_QUESTION)
        assert payload["answer"] == answer, name
        assert [c["chunk_id"] for c in payload["citations"]] == cited, name


def test_readme_demo_facts_are_the_demos(demo_client: TestClient, tokens: dict[str, str]) -> None:
    text = " ".join(README.read_text().split())
    documents = load_documents([run.CORPUS_DIR])
    assert f"ingests {len(documents)} policy documents" in text
    assert run.SAME_QUESTION in text and run.RESTRICTED_QUESTION in text
    future = [d for d in documents if d.doc_id == "returns-apac" and d.version == "2"]
    assert f"starts in {future[0].visibility.effective_from.year}" in text
    payload = ask(demo_client, tokens["ana"], run.RESTRICTED_QUESTION)
    assert f'"abstain_reason": "{payload["abstain_reason"]}"' in text


def test_a_demo_index_from_an_earlier_release_is_built_again(
    tmp_path: Path, embedder: Embedder
) -> None:
    data_dir = tmp_path / "demo-data"
    data_dir.mkdir()
    with sqlite3.connect(data_dir / "catalog.db") as db:  # chunks without a tenant
        db.execute("CREATE TABLE chunks (chunk_id TEXT PRIMARY KEY, doc_id TEXT, text TEXT)")
    issuer = ensure_dev_issuer(data_dir)
    report = run.prepare_data(data_dir, embedder, progress=False)
    assert report is not None and report.documents == len(load_documents([run.CORPUS_DIR]))
    assert ensure_dev_issuer(data_dir).key.public_jwk() == issuer.key.public_jwk()  # kept
