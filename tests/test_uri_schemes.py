"""A document's `uri` is an `http(s)` URL or a relative reference: any other scheme
(`javascript:`, `data:`, ...) is refused at ingest, by file, CLI and push API alike, and a
uri stored before that comes back from every read route as `""`."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from gateway.api.app import create_app
from gateway.authn.apikeys import create_key
from gateway.cli import app as cli
from gateway.domain import Document, Visibility
from gateway.embedding import Embedder
from gateway.ingest.parse import DocumentsRefused, parse_record
from gateway.ingest.pipeline import ingest_documents
from gateway.ingest.sources import load_documents
from gateway.storage.layout import DataLayout
from tests.helpers.documents import doc
from tests.helpers.identity import TokenFactory, bearer, make_settings

RECORD: dict[str, Any] = {
    "doc_id": "refunds",
    "tenant": "acme",
    "region": "EU",
    "acl": ["group:staff"],
    "effective_from": "2024-01-01",
}
REFUSED = {
    "javascript:alert(1)": "javascript:",
    " JaVaScRiPt:alert(1)": "javascript:",
    "java&#115;cript:alert(1)": "javascript:",
    "javascript\\:alert(1)": "javascript:",  # Markdown renders the escape away
    "java\tscript:alert(1)": "contains control characters",
    "data:text/html;base64,PHNjcmlwdD4=": "data:",
    "VBScript:msgbox": "vbscript:",
    "file:///etc/passwd": "file:",
}
ACCEPTED = [
    "https://wiki.example/refunds",
    "HTTP://wiki.example/refunds",
    "/wiki/refunds",
    "docs/refund:policy.md",
    "//wiki.example/refunds",
    "?page=2",
    "",
]


@pytest.mark.parametrize("uri", REFUSED)
def test_a_uri_of_another_scheme_is_refused_naming_the_field(uri: str) -> None:
    with pytest.raises(DocumentsRefused) as refused:
        parse_record({**RECORD, "uri": uri}, "Refunds take five days.", "docs.jsonl:3", "")
    [problem] = refused.value.problems
    assert (problem.source, problem.field) == ("docs.jsonl:3", "uri")
    assert REFUSED[uri] in problem.message


@pytest.mark.parametrize("uri", ACCEPTED)
def test_http_and_relative_uris_are_kept_as_written(uri: str) -> None:
    document = parse_record({**RECORD, "uri": uri}, "Refunds take five days.", "x.md", "")
    assert document.uri == uri


def test_a_file_path_that_reads_as_a_scheme_becomes_a_relative_uri(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "javascript:alert(1).md").write_text("Refunds take five days.\n")
    monkeypatch.chdir(tmp_path)
    [document] = load_documents([Path("javascript:alert(1).md")], RECORD)
    assert document.uri == "./javascript:alert(1).md"


def test_gateway_ingest_refuses_the_file_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "refunds.md"
    fields = "\n".join(f"{k}: {v}" for k, v in RECORD.items() if k != "acl")
    path.write_text(f"---\n{fields}\nacl: [group:staff]\nuri: javascript:alert(1)\n---\nBody.\n")
    data = tmp_path / "data"
    result = CliRunner().invoke(cli, ["ingest", str(path), "--data-dir", str(data)])
    assert result.exit_code != 0
    assert f"{path}: uri: must be an http(s) URL or a relative reference" in result.output
    assert "not javascript:" in result.output
    assert not (data / "lexical").exists()  # nothing was ingested


LEGACY_URI = "javascript:alert(document.cookie)"


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, embedder: Embedder, jwks_file: Path
) -> Iterator[tuple[TestClient, str]]:
    """A server whose catalog holds a document stored with a `javascript:` uri, written
    as an ingest before this release could write it; and an ingest key."""
    layout = DataLayout(tmp_path_factory.mktemp("legacy"))
    visibility = Visibility("acme", "EU", ("group:staff",), dt.date(2020, 1, 1), None)
    legacy = Document(
        "legacy", "1", "Legacy pelicans", LEGACY_URI, "Pelican quota PQ-77.", visibility
    )
    safe = dataclasses.replace(legacy, doc_id="current", uri="https://wiki.example/pelicans")
    ingest_documents([legacy, safe], layout, embedder)
    key, _ = create_key(
        layout.open_catalog(), tenant="acme", region="EU", principals=[], scope="ingest"
    )
    with TestClient(create_app(make_settings(layout.root, jwks_file), embedder=embedder)) as c:
        yield c, key


def test_a_push_with_a_javascript_uri_is_422_naming_the_field(
    served: tuple[TestClient, str],
) -> None:
    client, key = served
    documents = [doc("fine"), doc("bad", uri="javascript:alert(1)")]
    response = client.post("/admin/documents", json={"documents": documents}, headers=bearer(key))
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    [error] = response.json()["errors"]
    assert (error["index"], error["doc_id"], error["field"]) == (1, "bad", "uri")
    assert "http(s)" in error["message"]


def test_a_uri_stored_before_is_served_as_empty(
    served: tuple[TestClient, str], make_token: TokenFactory
) -> None:
    client, _ = served
    ann = bearer(make_token(sub="ann", tenant="acme", groups=["staff"]))
    found = client.post("/search", json={"query": "pelican quota"}, headers=ann).json()
    assert {r["doc_id"]: r["uri"] for r in found["results"]} == {
        "legacy": "",
        "current": "https://wiki.example/pelicans",
    }
    answer = client.post("/answer", json={"query": "What is the pelican quota?"}, headers=ann)
    assert LEGACY_URI not in answer.text
    assert client.get("/documents/legacy", headers=ann).json()["uri"] == ""
    assert client.get("/chunks/legacy@1:0", headers=ann).json()["uri"] == ""
