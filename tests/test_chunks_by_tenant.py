"""Reading a version's chunks (the /answer expand stage, GET /documents) reads its tenant's
rows only (invariant 13: no timing of one tenant depends on another tenant's content). It
selected by doc_id alone and dropped other tenants' rows in Python: tenant acme's expand
stage took 0.9 ms, then 16.7 ms once tenant globex held 3,911 chunks under the same doc_id.

Without timing anything, the work is counted: SQLite's virtual machine instructions for each
statement on the chunks table that acme's requests ran, before and after globex's ingest."""

from __future__ import annotations

import datetime as dt
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, event

from gateway.api.app import create_app
from gateway.domain import Document, Visibility
from gateway.embedding import Embedder
from gateway.ingest.chunk import ChunkingOptions
from gateway.ingest.pipeline import ingest_documents
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ALICE
from tests.helpers.identity import TokenFactory, bearer, make_settings

DOC_ID = "shared-name"  # the same doc_id and version in both tenants
QUESTION = {"query": "What does rule SNX-1 say about refunds?"}


def _document(tenant: str, title: str, text: str) -> Document:
    visibility = Visibility(tenant, "EU", ("group:staff",), dt.date(2020, 1, 1), None)
    return Document(DOC_ID, "1", title, "x.md", text, visibility)


@contextmanager
def chunk_statements() -> Iterator[list[tuple[str, Any]]]:
    """The SQL and parameters of every statement on the chunks table run meanwhile."""
    seen: list[tuple[str, Any]] = []

    def note(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if "FROM chunks" in statement:
            seen.append((statement, parameters))

    event.listen(Engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(Engine, "before_cursor_execute", note)


def instructions(catalog: Path, statements: list[tuple[str, Any]]) -> list[int]:
    """SQLite's virtual machine instructions for each statement, run again on the catalog:
    the work it does, which grows with every row it reads."""
    steps = 0

    def step() -> int:
        nonlocal steps
        steps += 1
        return 0  # go on

    counts = []
    with sqlite3.connect(catalog) as db:
        db.set_progress_handler(step, 1)
        for statement, parameters in statements:
            before = steps
            db.execute(statement, parameters).fetchall()
            counts.append(steps - before)
    return counts


def test_a_tenants_chunks_are_read_without_another_tenants_under_the_same_doc_id(
    tmp_path: Path, embedder: Embedder, jwks_file: Path, make_token: TokenFactory
) -> None:
    layout = DataLayout(tmp_path / "data")
    acme = "Rule SNX-1 says refunds are paid in five days.\n\nKeep the receipt for a year."
    # Globex holds a short version to begin with, so that acme's rows have the same
    # neighbours in the catalog's indexes before and after it writes a long one.
    first = [_document("acme", "Acme note", acme), _document("globex", "Globex", "Short.")]
    ingest_documents(first, layout, embedder)
    alice = bearer(make_token(**ALICE))

    def read(client: TestClient) -> tuple[dict[str, Any], dict[str, Any], list[int]]:
        with chunk_statements() as statements:
            answer = client.post("/answer", json=QUESTION, headers=alice)
            document = client.get(f"/documents/{DOC_ID}", headers=alice)
        assert answer.status_code == 200, answer.text
        assert document.status_code == 200, document.text
        assert statements  # the expand stage's, the answerer's, the document's
        kept = {k: answer.json()[k] for k in ("answer", "abstained", "citations")}
        return kept, document.json(), instructions(layout.catalog, statements)

    with TestClient(create_app(make_settings(layout.root, jwks_file), embedder=embedder)) as client:
        answer, document, work = read(client)
        assert [c["doc_id"] for c in answer["citations"]] == [DOC_ID]
        # The other tenant writes its version again, in hundreds of chunks.
        paragraphs = (f"Line {n} of the ledger lists item {n}, part {n * 7}." for n in range(300))
        globex = _document("globex", "Globex note", "\n\n".join(paragraphs))
        small_chunks = ChunkingOptions(max_tokens=32, overlap_tokens=0)
        ingest_documents([globex], layout, embedder, small_chunks)
        assert len(layout.open_catalog().chunks_of("globex", DOC_ID, "1")) >= 100
        assert read(client) == (answer, document, work)
