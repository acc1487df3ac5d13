"""Whose metadata a file takes: its own sidecar, found whatever the case of its suffix,
never one of two, and never the sidecar or name of a link that leads to it."""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.domain import Document
from gateway.ingest import sources
from gateway.ingest.parse import DocumentsRefused
from gateway.ingest.sources import load_documents

BROAD = {"tenant": "acme", "region": "EU", "acl": ["group:staff"], "effective_from": "2020-01-01"}


def seen(documents: Sequence[Document]) -> list[tuple[str, tuple[str, ...], str]]:
    return [(d.doc_id, d.visibility.acl, d.text) for d in documents]


def hr_file(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "z.txt").write_text("Salary grades")
    (folder / "z.txt.meta.yaml").write_text("acl: [group:hr]\n")
    return folder / "z.txt"


def refused(paths: list[Path]) -> set[tuple[str, str, str]]:
    with pytest.raises(DocumentsRefused) as caught:
        load_documents(paths, BROAD)
    return {(p.source, p.field, p.message) for p in caught.value.problems}


def test_a_link_in_the_folder_never_lends_the_file_its_name_or_sidecar(tmp_path: Path) -> None:
    """`b.txt -> z.txt` was read once, as `b` with b's metadata (the defaults' broad ACL),
    and `z` not at all: the HR file's text went to all staff."""
    folder = tmp_path / "share"
    hr_file(folder)
    (folder / "b.txt").symlink_to("z.txt")
    (folder / "sub").mkdir()
    (folder / "sub" / "a.txt").symlink_to("../z.txt")
    (folder / "sub" / "a.txt.meta.yaml").write_text("acl: [group:all]\n")
    skipped: list[Path] = []
    linked: list[Path] = []
    documents = load_documents([folder], BROAD, skipped=skipped, linked=linked)
    assert seen(documents) == [("z", ("group:hr",), "Salary grades")]
    assert documents[0].source == str(folder / "z.txt")
    assert sorted(linked) == [folder / "b.txt", folder / "sub" / "a.txt"] and skipped == []


def test_a_link_named_on_its_own_is_read_as_the_file_it_leads_to(tmp_path: Path) -> None:
    """`gateway ingest share/*.txt` names the links too: each is the HR file, read once."""
    target = hr_file(tmp_path / "share")
    (tmp_path / "share" / "b.txt").symlink_to("z.txt")
    (tmp_path / "share" / "b.txt.meta.yaml").write_text("acl: [group:all]\n")
    for named in ([tmp_path / "share" / "b.txt"], [tmp_path / "share" / "b.txt", target]):
        [document] = load_documents(named, BROAD)
        assert seen([document]) == [("z", ("group:hr",), "Salary grades")]
        assert document.source == str(target)

    (tmp_path / "share" / "z.dat").write_text("Salary grades")
    (tmp_path / "share" / "c.txt").symlink_to("z.dat")
    why = "a link to z.dat: unsupported type; expected .md, .markdown, .txt, .jsonl, "
    assert refused([tmp_path / "share" / "c.txt"]) == {
        (str(tmp_path / "share" / "c.txt"), "file", why + ".html, .htm or .pdf")
    }


@pytest.mark.parametrize("other", ["b.txt.meta.json", "b.txt.meta.yml", "b.txt.META.YAML"])
def test_a_file_with_two_sidecars_is_refused_naming_both(tmp_path: Path, other: str) -> None:
    """`.meta.yaml` won silently, even over a narrower `.meta.json`."""
    (tmp_path / "b.txt").write_text("Salary grades")
    (tmp_path / "b.txt.meta.yaml").write_text("acl: [group:staff]\n")
    (tmp_path / other).write_text('{"acl": ["group:hr"]}')
    (tmp_path / "c.txt").write_text("Canteen opens at noon")
    names = ", ".join(sorted(["b.txt.meta.yaml", other]))
    message = f"more than one sidecar ({names}); keep one"
    assert refused([tmp_path]) == {(str(tmp_path / "b.txt"), "file", message)}


def test_a_sidecar_suffix_in_any_case_is_the_files_own(tmp_path: Path) -> None:
    """`b.txt.META.YAML` was passed over, and the defaults' broad ACL applied, where the
    document's own suffix is read in any case (`C.TXT`)."""
    (tmp_path / "b.txt").write_text("Salary grades")
    (tmp_path / "b.txt.META.YAML").write_text("acl: [group:hr]\n")
    (tmp_path / "C.TXT").write_text("Bonus pool")
    (tmp_path / "C.TXT.Meta.Json").write_text('{"acl": ["group:board"]}')
    (tmp_path / "d.txt").write_text("Canteen opens at noon")
    (tmp_path / "d.txt.old.meta.yaml").write_text("acl: [group:hr]\n")  # d.txt.old's, not d's
    documents = sorted(load_documents([tmp_path], BROAD), key=lambda d: d.doc_id)
    assert [(d.doc_id, d.visibility.acl) for d in documents] == [
        ("C", ("group:board",)),
        ("b", ("group:hr",)),
        ("d", ("group:staff",)),
    ]
    [named] = load_documents([tmp_path / "b.txt"], BROAD)
    assert named.visibility.acl == ("group:hr",)


def test_a_sidecar_that_cannot_be_read_refuses_its_document(tmp_path: Path) -> None:
    """A dangling link was no sidecar (`is_file()`), so the defaults applied unnoticed."""
    (tmp_path / "b.txt").write_text("Salary grades")
    (tmp_path / "b.txt.meta.yaml").symlink_to("hr.yaml")  # not (or no longer) there
    assert refused([tmp_path]) == {
        (str(tmp_path / "b.txt.meta.yaml"), "file", os.strerror(errno.ENOENT)),
    }


def test_a_file_swapped_for_a_link_after_the_walk_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer of the folder replaces `b.txt` by a link to the HR file while the folder
    is read: its text must not be read as `b`, with b's sidecar."""
    folder = tmp_path / "share"
    hr_file(folder)
    (folder / "b.txt").write_text("Canteen opens at noon")
    (folder / "b.txt.meta.yaml").write_text("acl: [group:all]\n")
    walk = sources._files

    def walk_then_swap(*args: Any) -> Any:
        found = walk(*args)
        (folder / "b.txt").unlink()
        (folder / "b.txt").symlink_to("z.txt")
        return found

    monkeypatch.setattr(sources, "_files", walk_then_swap)
    assert refused([folder]) == {(str(folder / "b.txt"), "file", os.strerror(errno.ELOOP))}


def test_a_file_that_is_not_utf8_is_refused_saying_so(tmp_path: Path) -> None:
    """Python's own words ("'utf-8' codec can't decode byte 0xe9 ...") did not say that
    UTF-8 is what ingest reads, nor what to do; the byte and its offset are named, never
    the text around them."""
    folder = tmp_path / "share"
    folder.mkdir()
    (folder / "cafe.md").write_bytes("Caf\u00e9 hours".encode("latin-1"))
    (folder / "menu.txt").write_text("Lunch")
    (folder / "menu.txt.meta.yaml").write_bytes("title: Men\u00fc\n".encode("latin-1"))
    why = "not UTF-8 text (byte 0x{:02x} at offset {}): save it as UTF-8"
    assert refused([folder]) == {
        (str(folder / "cafe.md"), "file", why.format(0xE9, 3)),
        (str(folder / "menu.txt.meta.yaml"), "file", why.format(0xFC, 10)),
    }
