"""Document metadata that a parse could read as broader visibility than the file gives:
front matter never closed (read as body text, its ACL dropped), a misspelt key (ignored,
leaving the field to a broader default), YAML 1.1 numbers rewriting `version`, and a blank
`effective_to` undoing an end date given by a sidecar or `--effective-to`."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gateway.cli import app as cli
from gateway.ingest.parse import FIELDS, DocumentProblem, DocumentsRefused
from gateway.ingest.sources import load_documents
from tests.helpers.documents import write

BODY_SECRET = "BODY-SECRET-4410"  # must never appear in a problem message
FRONT = "doc_id: d\ntenant: acme\nregion: EU\nacl: [group:board]\neffective_from: 2024-01-01\n"
# Broader than FRONT: what a file falls back to when its own fields are lost.
DEFAULTS: dict[str, Any] = {
    "tenant": "acme",
    "region": "EU",
    "acl": ["group:everyone"],
    "effective_from": "2024-01-01",
}


def refused(paths: list[Path], defaults: dict[str, Any] | None = None) -> list[DocumentProblem]:
    with pytest.raises(DocumentsRefused) as info:
        load_documents(paths, defaults)
    assert BODY_SECRET not in str(info.value)
    return info.value.problems


# --- 1. front matter must close -----------------------------------------------------------


def test_front_matter_may_close_with_yaml_document_end(tmp_path: Path) -> None:
    path = write(tmp_path / "d.md", f"---\n{FRONT}...\nBody {BODY_SECRET}.\n")
    [doc] = load_documents([path], DEFAULTS)
    assert doc.visibility.acl == ("group:board",)  # its own, not the defaults'
    assert doc.text == f"Body {BODY_SECRET}.\n"


@pytest.mark.parametrize("defaults", [DEFAULTS, None])
def test_front_matter_never_closed_is_refused_not_read_as_body(
    tmp_path: Path, defaults: dict[str, Any] | None
) -> None:
    path = write(tmp_path / "d.md", f"---\n{FRONT}effective_to: 2024-03-31\nBody {BODY_SECRET}.\n")
    [problem] = refused([path], defaults)
    assert (problem.source, problem.field) == (str(path), "front_matter")
    assert "opened by --- on line 1 is never closed" in problem.message


def test_a_sidecar_does_not_stand_in_for_unclosed_front_matter(tmp_path: Path) -> None:
    path = write(tmp_path / "d.md", f"---\n{FRONT}\nBody {BODY_SECRET}.\n")
    write(tmp_path / "d.md.meta.yaml", json.dumps(DEFAULTS))
    [problem] = refused([path])
    assert "never closed" in problem.message


def test_an_indented_first_line_opens_no_front_matter(tmp_path: Path) -> None:
    # ` ---` is no YAML marker; Markdown reads it as a rule: body text, as before.
    path = write(tmp_path / "rule.md", f" ---\nBody {BODY_SECRET}.\n")
    [doc] = load_documents([path], DEFAULTS)
    assert (doc.doc_id, doc.text) == ("rule", f" ---\nBody {BODY_SECRET}.\n")


# --- 2. unknown keys ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "key", "near"),
    [
        ("effective_until: 2024-03-31", "effective_until", "effective_to"),
        ("ACL: [user:x]", "ACL", "acl"),
        ("acls: [user:x]", "acls", "acl"),
        ("regoin: US", "regoin", "region"),
        ("Effective_To: 2024-03-31", "Effective_To", "effective_to"),
    ],
)
def test_a_misspelt_front_matter_key_is_refused(
    tmp_path: Path, line: str, key: str, near: str
) -> None:
    path = write(tmp_path / "d.md", f"---\n{FRONT}{line}\n---\nBody {BODY_SECRET}.\n")
    [problem] = refused([path], DEFAULTS)
    assert (problem.source, problem.field) == (str(path), "front_matter")
    assert problem.message == f"unknown key `{key}` (did you mean `{near}`?)"


def test_a_misspelt_jsonl_key_is_refused_naming_the_line(tmp_path: Path) -> None:
    good = {**DEFAULTS, "doc_id": "a", "text": f"Body {BODY_SECRET}."}
    lines = [good, {**good, "doc_id": "b", "effective_until": "2024-03-31"}, {**good, "txt": "x"}]
    path = write(tmp_path / "d.jsonl", "\n".join(json.dumps(r) for r in lines) + "\n")
    problems = refused([path])
    assert [(p.source, p.field, p.message) for p in problems] == [
        (f"{path}:2", "json", "unknown key `effective_until` (did you mean `effective_to`?)"),
        (f"{path}:3", "json", "unknown key `txt` (did you mean `text`?)"),
    ]


def test_other_front_matter_keys_stay_ignored(tmp_path: Path) -> None:
    extra = "owner: ann\ntags: [a, b]\nlayout: page\nurl: /x\n_id: 9\n"
    path = write(tmp_path / "d.md", f"---\n{FRONT}{extra}---\nBody {BODY_SECRET}.\n")
    [doc] = load_documents([path])
    assert doc.visibility.acl == ("group:board",)


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        (
            "d.md.meta.yaml",
            "effective_until: 2024-03-31\n",
            "`effective_until` (did you mean `effective_to`?)",
        ),
        ("d.md.meta.yml", "owner: ann\n", "`owner`"),
        ("d.md.meta.json", '{"Acl": ["user:x"]}', "`Acl` (did you mean `acl`?)"),
        ("d.md.meta.yaml", "1: x\n", "1"),
    ],
)
def test_any_unknown_sidecar_key_is_refused(
    tmp_path: Path, name: str, content: str, says: str
) -> None:
    path = write(tmp_path / "d.md", f"---\n{FRONT}---\nBody {BODY_SECRET}.\n")
    sidecar = write(tmp_path / name, content)
    [problem] = refused([path])
    assert (problem.source, problem.field) == (str(sidecar), "metadata")
    assert problem.message == f"unknown key {says}; expected only {', '.join(FIELDS)}"


# --- 3. version as written ----------------------------------------------------------------


@pytest.mark.parametrize("raw", ["010", "1_0", "0x1F", "0o17", "1.10", "+7", "7"])
def test_version_is_the_text_written(tmp_path: Path, raw: str) -> None:
    path = write(tmp_path / "d.md", f"---\n{FRONT}version: {raw}\n---\nBody.\n")
    [doc] = load_documents([path])
    assert doc.version == raw
    other = write(tmp_path / "o.txt", "Body.\n")
    write(tmp_path / "o.txt.meta.yaml", f"{FRONT}version: {raw}\n")
    [doc] = load_documents([other])
    assert doc.version == raw


def test_a_base_60_version_is_refused_not_read_as_90(tmp_path: Path) -> None:
    path = write(tmp_path / "d.md", f"---\n{FRONT}version: 1:30\n---\nBody.\n")
    [problem] = refused([path])
    assert problem.field == "version" and "'1:30'" in problem.message


def test_json_numbers_as_versions_are_read_as_before(tmp_path: Path) -> None:
    path = write(tmp_path / "d.txt", "Body.\n")
    write(tmp_path / "d.txt.meta.json", json.dumps({**DEFAULTS, "version": 3}))
    [doc] = load_documents([path])
    assert doc.version == "3"
    record = {**DEFAULTS, "doc_id": "j", "text": "Body."}
    lines = [{**record, "version": 7}, {**record, "doc_id": "k", "version": 1.1}]
    jsonl = write(tmp_path / "d.jsonl", "\n".join(json.dumps(r) for r in lines) + "\n")
    [problem] = refused([jsonl])
    assert (problem.source, problem.field) == (f"{jsonl}:2", "version")
    assert "float" in problem.message


# --- 4. a blank effective_to is not given -------------------------------------------------


def test_blank_effective_to_in_front_matter_keeps_the_sidecar_end(tmp_path: Path) -> None:
    path = write(tmp_path / "d.md", f"---\n{FRONT}effective_to:\n---\nBody.\n")
    write(tmp_path / "d.md.meta.yaml", "effective_to: 2024-03-31\n")
    [doc] = load_documents([path])
    assert doc.visibility.effective_to == dt.date(2024, 3, 31)


@pytest.mark.parametrize(
    ("name", "content"),
    [("d.txt.meta.yaml", "effective_to: null\n"), ("d.txt.meta.json", '{"effective_to": null}')],
)
def test_null_effective_to_in_a_sidecar_keeps_the_default_end(
    tmp_path: Path, name: str, content: str
) -> None:
    path = write(tmp_path / "d.txt", "Body.\n")
    write(tmp_path / name, content)
    [doc] = load_documents([path], {**DEFAULTS, "effective_to": "2024-03-31"})
    assert doc.visibility.effective_to == dt.date(2024, 3, 31)


def test_null_effective_to_in_a_jsonl_record_keeps_the_sidecar_end(tmp_path: Path) -> None:
    record = {**DEFAULTS, "doc_id": "j", "text": "Body.", "effective_to": None}
    path = write(tmp_path / "d.jsonl", json.dumps(record) + "\n")
    write(tmp_path / "d.jsonl.meta.yaml", "effective_to: 2024-03-31\n")
    [doc] = load_documents([path])
    assert doc.visibility.effective_to == dt.date(2024, 3, 31)


def test_blank_effective_to_with_no_earlier_end_is_open_ended(tmp_path: Path) -> None:
    path = write(tmp_path / "d.md", f"---\n{FRONT}effective_to:\n---\nBody.\n")
    [doc] = load_documents([path])
    assert doc.visibility.effective_to is None


# --- through the command ------------------------------------------------------------------


def test_gateway_ingest_lists_each_problem_and_writes_nothing(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    unclosed = write(docs / "a.md", f"---\n{FRONT}\nBody {BODY_SECRET}.\n")
    front = FRONT.replace("doc_id: d", "doc_id: b")
    write(docs / "b.md", f"---\n{front}---\nBody {BODY_SECRET}.\n")
    sidecar = write(docs / "b.md.meta.yaml", "effective_until: 2024-03-31\n")
    data = tmp_path / "data"
    defaults = ["--tenant", "acme", "--region", "EU", "--acl", "group:everyone"]
    args = ["ingest", str(docs), *defaults, "--effective-from", "2024-01-01"]
    result = CliRunner().invoke(cli, [*args, "--data-dir", str(data)])
    assert result.exit_code == 1, result.output
    assert "refused, nothing was ingested:" in result.output
    assert f"{unclosed}: front_matter: front matter opened by --- on line 1" in result.output
    hint = "unknown key `effective_until` (did you mean `effective_to`?)"
    assert f"{sidecar}: metadata: {hint}" in result.output
    assert BODY_SECRET not in result.output
    assert not data.exists()
