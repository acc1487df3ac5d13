"""`gateway ingest` of a folder holding no document is an error: it said "generation 0"
and exited 0, so a wrong path looked like an ingest that worked. An ingest never removes
a version (`gateway delete` and `gateway sync` do), so finding nothing asks for nothing."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gateway.cli import app as cli


def test_a_folder_without_documents_is_refused_and_no_data_dir_is_made(tmp_path: Path) -> None:
    empty, others = tmp_path / "empty", tmp_path / "others"
    empty.mkdir()
    others.mkdir()
    (others / "notes.docx").write_bytes(b"PK\x03\x04")  # not a format ingest reads
    (others / "old.md.meta.yaml").write_text("tenant: acme\n")  # a sidecar alone
    data = tmp_path / "data"
    for folder in (empty, others):
        result = CliRunner().invoke(cli, ["ingest", str(folder), "--data-dir", str(data)])
        assert result.exit_code == 1, result.output
        assert f"no documents found in {folder}" in result.output
        assert ".md" in result.output and "generation" not in result.output
    assert not data.exists()  # no catalog, no generation 0 made
