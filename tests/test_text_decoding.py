"""How HTML files' bytes become the text that is indexed and quoted: by a byte order mark,
as UTF-8 when they are UTF-8, else by the charset the page declares, else as windows-1252
(the WHATWG fallback for an undeclared legacy page), never by a statistical guess."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.cli import app as cli
from gateway.ingest.sources import load_documents
from gateway.storage.layout import DataLayout

META = {"tenant": "acme", "region": "EU", "acl": ["group:staff"], "effective_from": "2020-01-01"}
FRENCH = "Une approche naïve, très simple : « déjà » vu, coût réduit."
ITALIAN = "Perché è così facile? La città è già pronta."


def page(body: str, head: str = "", title: str = "Guide") -> str:
    return f"<html><head>{head}<title>{title}</title></head><body><p>{body}</p></body></html>"


def ingested_text(tmp_path: Path, name: str, raw: bytes) -> tuple[str, str]:
    """(text, title) of the page as `gateway ingest` reads it from a file."""
    (tmp_path / name).write_bytes(raw)
    [document] = load_documents([tmp_path / name], defaults=META)
    return document.text, document.title


@pytest.mark.parametrize("body", [FRENCH, ITALIAN], ids=["french", "italian"])
def test_an_undeclared_legacy_page_is_read_as_windows_1252(tmp_path: Path, body: str) -> None:
    """It was read by a guess, as windows-1250: `naïve` became `naďve`, `très` `trčs`."""
    raw = page(body, title="Présentation générale").encode("windows-1252")
    assert ingested_text(tmp_path, "legacy.html", raw) == (body, "Présentation générale")


def test_an_undeclared_utf8_page_is_read_as_utf8(tmp_path: Path) -> None:
    raw = page(FRENCH + " 日本語").encode("utf-8")
    assert ingested_text(tmp_path, "modern.html", raw)[0] == FRENCH + " 日本語"


@pytest.mark.parametrize(
    ("head", "body", "encoding"),
    [
        ('<meta charset="windows-1250">', "Příliš žluťoučký kůň úpěl ďábelské ódy.", "cp1250"),
        ('<meta charset="Shift_JIS">', "日本語のテキストです。", "shift_jis"),
        (
            '<meta http-equiv="Content-Type" content="text/html; charset=koi8-r">',
            "Съешь же ещё этих мягких французских булок.",
            "koi8-r",
        ),
    ],
)
def test_a_declared_charset_is_honoured(
    tmp_path: Path, head: str, body: str, encoding: str
) -> None:
    raw = page(body, head).encode(encoding)
    assert ingested_text(tmp_path, "declared.html", raw)[0] == body


def test_a_page_declaring_latin_1_is_read_as_windows_1252(tmp_path: Path) -> None:
    """As browsers read it: its 0x93 and 0x94 are curly quotes (they were kept as C1
    control characters, which no search matches)."""
    body = "Le « guide » dit “naïve” — voilà."
    raw = page(body, '<meta charset="iso-8859-1">').encode("windows-1252")
    assert ingested_text(tmp_path, "latin1.html", raw)[0] == body


def test_a_page_mislabelled_utf8_is_read_as_windows_1252(tmp_path: Path) -> None:
    """A legacy page whose template says UTF-8: its bytes are not UTF-8, so the label is
    wrong, and the page reads as an undeclared one."""
    raw = page(FRENCH, '<meta charset="utf-8">').encode("windows-1252")
    assert ingested_text(tmp_path, "mislabelled.html", raw)[0] == FRENCH


def test_a_byte_order_mark_wins(tmp_path: Path) -> None:
    raw = page(FRENCH, '<meta charset="windows-1252">').encode("utf-16")  # with its BOM
    assert ingested_text(tmp_path, "utf16.html", raw)[0] == FRENCH


@pytest.mark.parametrize("label", ["unicode_escape", "x-no-such-charset", "base64"])
def test_an_unusable_declared_charset_reads_as_undeclared(tmp_path: Path, label: str) -> None:
    """A label no browser knows decodes nothing: `unicode_escape` would turn `\\x00` in the
    markup into a NUL."""
    body = FRENCH + r" C:\x00\new"
    raw = page(body, f'<meta charset="{label}">').encode("windows-1252")
    assert ingested_text(tmp_path, "odd.html", raw)[0] == body


@pytest.mark.model  # the CLI loads the model itself
def test_gateway_ingest_indexes_the_words_of_an_undeclared_legacy_page(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "guide.html").write_bytes(page(FRENCH).encode("windows-1252"))
    args = ["ingest", str(docs), "--tenant", "acme", "--region", "EU", "--acl", "group:staff"]
    args += ["--effective-from", "2020-01-01", "--data-dir", str(tmp_path / "data")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    chunks = DataLayout(tmp_path / "data").open_catalog().chunks_of("acme", "guide", "1")
    text = " ".join(c.text for c in chunks)
    assert "naïve" in text and "très" in text and "naďve" not in text
