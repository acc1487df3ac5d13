"""HTML and PDF documents, sidecar metadata and command-line defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.cli import app as cli
from gateway.ingest.chunk import sections
from gateway.ingest.formats import extract_html, extract_pdf
from gateway.ingest.parse import DocumentsRefused
from gateway.ingest.sources import load_documents
from gateway.storage.layout import DataLayout
from tests.helpers.documents import minimal_pdf

META = {"tenant": "acme", "region": "EU", "acl": ["group:staff"], "effective_from": "2020-01-01"}
PAGE = b"""<!doctype html><html><head><title>Refund handbook</title>
<style>p { color: red }</style><script>alert("never text")</script></head>
<body><nav>Home | Menu</nav><h1>Refunds</h1><p>Refunds are paid within <b>five</b> days.</p>
<h2>Exceptions</h2><ul><li>Gift cards</li><li>Final sale items</li></ul>
<div>Loose text <p>nested paragraph</p> after it</div><footer>(c) 2026</footer></body></html>"""


def test_html_keeps_reading_order_and_headings_drops_chrome() -> None:
    page = extract_html(PAGE)
    assert page.title == "Refund handbook"
    assert page.text.split("\n\n") == [
        "# Refunds",
        "Refunds are paid within five days.",
        "## Exceptions",
        "Gift cards",
        "Final sale items",
        "Loose text",
        "nested paragraph",
        "after it",
    ]
    assert len(sections(page.text)) == 2  # the headings are the chunks' parents


def test_pdf_text_and_title(tmp_path: Path) -> None:
    pdf = extract_pdf(minimal_pdf(tmp_path / "m.pdf", ["Keys are counted daily.", "KEY-77"]))
    assert pdf.title == "Store manual"
    assert "Keys are counted daily." in pdf.text and "KEY-77" in pdf.text


def test_sidecar_and_defaults_give_metadata(tmp_path: Path) -> None:
    (tmp_path / "handbook.html").write_bytes(PAGE)
    minimal_pdf(tmp_path / "manual.pdf", ["Keys are counted daily."])
    (tmp_path / "manual.pdf.meta.yaml").write_text("acl: [group:managers]\nversion: 3\n")
    (tmp_path / "plain.txt").write_text("A plain note without front matter.\n")
    docs = {d.doc_id: d for d in load_documents([tmp_path], defaults=META)}
    assert set(docs) == {"handbook", "manual", "plain"}  # sidecars are not documents
    assert docs["handbook"].title == "Refund handbook" and docs["handbook"].uri.endswith(".html")
    assert docs["manual"].visibility.acl == ("group:managers",)  # the sidecar wins
    assert docs["manual"].version == "3" and docs["manual"].title == "Store manual"
    assert docs["plain"].visibility.tenant == "acme" and docs["plain"].title == "plain"


def test_front_matter_wins_over_sidecar_and_defaults(tmp_path: Path) -> None:
    front = "---\ndoc_id: own\ntenant: acme\nregion: US\nacl: [group:a]\n"
    front += "effective_from: 2021-01-01\n---\nBody."
    (tmp_path / "x.md").write_text(front)
    (tmp_path / "x.md.meta.yaml").write_text("region: EU\nacl: [group:b]\n")
    [doc] = load_documents([tmp_path / "x.md"], defaults={**META, "region": "APAC"})
    assert (doc.doc_id, doc.visibility.region, doc.visibility.acl) == ("own", "US", ("group:a",))


def test_deny_by_default_holds_whatever_the_source(tmp_path: Path) -> None:
    (tmp_path / "page.html").write_bytes(PAGE)
    (tmp_path / "broken.pdf").write_bytes(b"%PDF-1.4 not really")
    (tmp_path / "bad.txt.meta.yaml").write_text("- not a mapping\n")
    (tmp_path / "bad.txt").write_text("Text.\n")
    with pytest.raises(DocumentsRefused) as refused:
        load_documents([tmp_path], defaults={"tenant": "acme"})
    problems = {(Path(p.source).name, p.field) for p in refused.value.problems}
    assert ("page.html", "acl") in problems and ("page.html", "region") in problems
    assert ("broken.pdf", "file") in problems
    assert ("bad.txt.meta.yaml", "metadata") in problems


@pytest.mark.model  # the CLI loads the model itself
def test_cli_ingests_html_and_pdf_with_defaults(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "handbook.html").write_bytes(PAGE)
    minimal_pdf(docs / "manual.pdf", ["Keys are counted daily under rule KEY-77."])
    args = ["ingest", str(docs), "--tenant", "acme", "--region", "EU", "--acl", "group:staff"]
    args += ["--effective-from", "2020-01-01", "--data-dir", str(tmp_path / "data")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    rows = DataLayout(tmp_path / "data").open_catalog().all_documents()
    assert {r.doc_id for r in rows} == {"handbook", "manual"}
    assert all(json.loads(r.acl_json) == ["group:staff"] for r in rows)
    refused = CliRunner().invoke(cli, ["ingest", str(docs), "--data-dir", str(tmp_path / "d2")])
    assert refused.exit_code == 1 and "acl" in refused.output
