"""Reading a folder of documents (`gateway ingest DIR`, `gateway sync DIR`) never reads a
file outside it: a file or directory linked out of it is skipped and named, never opened,
and a sidecar linked out of it refuses its document. A link that stays inside is passed
over: the file it leads to is read there, under its own name (tests/test_ingest_sources.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.cli import app as cli
from gateway.ingest.parse import DocumentsRefused
from gateway.ingest.sources import load_documents
from tests.helpers.documents import write_doc

META = {"tenant": "acme", "region": "EU", "acl": ["group:staff"], "effective_from": "2020-01-01"}


def outside_secret(root: Path) -> Path:
    """A private file elsewhere that would make a valid document if it were read."""
    secret = write_doc(root / "private", "payroll.md", {"doc_id": "payroll", **META}, "PAY-991")
    secret.chmod(0o600)
    return secret


def test_files_and_folders_linked_out_of_the_folder_are_skipped_by_path(tmp_path: Path) -> None:
    secret = outside_secret(tmp_path)
    folder = tmp_path / "share"
    write_doc(folder, "travel.md", {"doc_id": "travel", **META}, "Economy class (TRV-6).")
    (folder / "notes.txt").symlink_to(secret)
    (folder / "notes.txt.meta.yaml").write_text(json.dumps({**META, "doc_id": "notes"}))
    (folder / "elsewhere").symlink_to(secret.parent, target_is_directory=True)
    (folder / "again.md").symlink_to(folder / "travel.md")  # inside: the same file, read once

    skipped: list[Path] = []
    documents = load_documents([folder], skipped=skipped)

    assert [d.doc_id for d in documents] == ["travel"]
    assert sorted(p.name for p in skipped) == ["elsewhere", "notes.txt"]
    assert all("PAY-991" not in d.text for d in documents)


def test_a_file_linked_out_of_the_folder_is_never_opened(tmp_path: Path) -> None:
    """A FIFO outside: opening it would hang the read, so finishing proves it was not."""
    os.mkfifo(tmp_path / "pipe.md")
    folder = tmp_path / "share"
    write_doc(folder, "travel.md", {"doc_id": "travel", **META}, "Economy class (TRV-6).")
    (folder / "pipe.md").symlink_to(tmp_path / "pipe.md")
    skipped: list[Path] = []
    assert [d.doc_id for d in load_documents([folder], skipped=skipped)] == ["travel"]
    assert skipped == [folder / "pipe.md"]


def test_a_sidecar_linked_out_of_the_folder_refuses_its_document(tmp_path: Path) -> None:
    metadata = tmp_path / "private" / "meta.yaml"
    metadata.parent.mkdir()
    metadata.write_text(json.dumps({**META, "doc_id": "handbook"}))
    metadata.chmod(0o600)
    folder = tmp_path / "share"
    folder.mkdir()
    (folder / "handbook.txt").write_text("Lockers open at 7 (LCK-7).")
    (folder / "handbook.txt.meta.yaml").symlink_to(metadata)

    with pytest.raises(DocumentsRefused) as refused:
        load_documents([folder], {"tenant": "acme"})
    [problem] = refused.value.problems
    assert problem.source == str(folder / "handbook.txt.meta.yaml")
    assert problem.field == "file" and "outside" in problem.message


def test_the_sidecar_of_a_named_file_may_not_leave_its_folder(tmp_path: Path) -> None:
    metadata = tmp_path / "meta.yaml"
    metadata.write_text(json.dumps({**META, "doc_id": "handbook"}))
    folder = tmp_path / "share"
    folder.mkdir()
    (folder / "handbook.txt").write_text("Lockers open at 7 (LCK-7).")
    (folder / "handbook.txt.meta.yaml").symlink_to(metadata)
    with pytest.raises(DocumentsRefused) as refused:
        load_documents([folder / "handbook.txt"])
    assert refused.value.problems[0].source == str(folder / "handbook.txt.meta.yaml")


def test_the_file_a_link_inside_the_folder_leads_to_is_read_there(tmp_path: Path) -> None:
    folder = tmp_path / "share"
    write_doc(folder / "real", "travel.md", {"doc_id": "travel", **META}, "Economy (TRV-6).")
    (folder / "travel.txt").symlink_to(folder / "real" / "travel.md")
    skipped: list[Path] = []
    linked: list[Path] = []
    [document] = load_documents([folder], skipped=skipped, linked=linked)
    assert document.source == str(folder / "real" / "travel.md")
    assert linked == [folder / "travel.txt"] and skipped == []


def test_a_link_loop_is_a_problem_naming_it_not_a_crash(tmp_path: Path) -> None:
    """`Path.resolve` raised RuntimeError on a loop (Python 3.11), out of `ingest` and
    `sync`. A loop reads as nothing, like a file that cannot be read: a problem by name."""
    folder = tmp_path / "share"
    write_doc(folder, "travel.md", {"doc_id": "travel", **META}, "Economy class (TRV-6).")
    (folder / "loop").mkdir()
    (folder / "loop" / "loop.md").symlink_to("loop.md")  # itself
    (folder / "a.md").symlink_to("b.md")  # round two links
    (folder / "b.md").symlink_to("a.md")
    (folder / "spin").symlink_to("spin")  # not a document: passed over, as other files are
    skipped: list[Path] = []
    with pytest.raises(DocumentsRefused) as refused:
        load_documents([folder], skipped=skipped)
    problems = {(p.source, p.field, p.message) for p in refused.value.problems}
    why = "cannot be read (Too many levels of symbolic links)"
    assert problems == {(str(folder / n), "file", why) for n in ("a.md", "b.md", "loop/loop.md")}
    assert skipped == []  # not a link out of the folder

    with pytest.raises(DocumentsRefused) as named:  # a loop named on its own
        load_documents([folder / "a.md"])
    assert [(p.source, p.message) for p in named.value.problems] == [(str(folder / "a.md"), why)]


def test_ingest_names_a_link_loop_and_ingests_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "share"
    write_doc(folder, "travel.md", {"doc_id": "travel", **META}, "Economy class (TRV-6).")
    (folder / "loop.md").symlink_to("loop.md")
    args = ["ingest", str(folder), "--data-dir", str(tmp_path / "data")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.exception
    assert f"{folder / 'loop.md'}: file: cannot be read" in result.output
