"""Parsing documents: anything without a usable ACL, tenant, region or dates is refused."""

from __future__ import annotations

import datetime as dt
import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gateway.cli import app as cli
from gateway.ingest.parse import DocumentProblem, DocumentsRefused, parse_record
from gateway.ingest.sources import load_documents
from tests.helpers.documents import STAFF_EU, write, write_doc

BODY_SECRET = "BODY-SECRET-7731"  # must never appear in a problem message
GOOD: dict[str, Any] = {
    "doc_id": "refunds",
    "tenant": "acme",
    "region": "EU",
    "acl": ["group:staff"],
    "effective_from": "2024-01-01",
}


def md(path: Path, front: str, body: str = f"Some text {BODY_SECRET}.\n") -> Path:
    return write(path, f"---\n{front.strip()}\n---\n{body}")


def md_fields(path: Path, fields: dict[str, Any], body: str = f"Text {BODY_SECRET}.\n") -> Path:
    """Front matter from a dict; values as JSON, which YAML reads back unchanged."""
    return md(path, "\n".join(f"{k}: {json.dumps(v)}" for k, v in fields.items()), body)


def jsonl(path: Path, records: list[dict[str, Any] | str]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    return write(path, "\n".join(lines) + "\n")


def refused(paths: list[Path]) -> list[DocumentProblem]:
    with pytest.raises(DocumentsRefused) as info:
        load_documents(paths)
    assert BODY_SECRET not in str(info.value)
    return info.value.problems


def where(problems: list[DocumentProblem]) -> set[tuple[str, str]]:
    return {(p.source, p.field) for p in problems}


# --- what is accepted ---------------------------------------------------------------------


def test_markdown_with_front_matter(tmp_path: Path) -> None:
    path = md(
        tmp_path / "refunds.md",
        """
doc_id: refunds
version: "2"
title: Refund policy
uri: https://wiki.example/refunds
tenant: acme
region: EU
acl: [group:staff, "user:ann", support:eu]
effective_from: 2024-01-01
effective_to: 2024-12-31
""",
        "Refunds are paid within 5 days.\n",
    )
    [doc] = load_documents([path])
    assert (doc.doc_id, doc.version, doc.label) == ("refunds", "2", "refunds@2")
    assert doc.title == "Refund policy"
    assert doc.uri == "https://wiki.example/refunds"
    assert doc.text == "Refunds are paid within 5 days.\n"
    assert doc.source == str(path)
    v = doc.visibility
    assert (v.tenant, v.region) == ("acme", "EU")
    assert v.acl == ("group:staff", "user:ann", "support:eu")
    assert (v.effective_from, v.effective_to) == (dt.date(2024, 1, 1), dt.date(2024, 12, 31))


def test_defaults_version_uri_and_open_end(tmp_path: Path) -> None:
    path = md_fields(tmp_path / "a.md", GOOD)
    [doc] = load_documents([path])
    assert doc.version == "1"
    assert doc.uri == str(path)
    assert doc.visibility.effective_to is None
    [doc] = load_documents([md_fields(tmp_path / "b.md", {**GOOD, "effective_to": None})])
    assert doc.visibility.effective_to is None


@pytest.mark.parametrize("raw", ["2024-03-05", '"2024-03-05"', "'2024-03-05'"])
def test_yaml_dates_and_string_dates(tmp_path: Path, raw: str) -> None:
    front = "doc_id: d\ntenant: acme\nregion: EU\nacl: [group:staff]\n"
    path = md(tmp_path / "d.md", front + f"effective_from: {raw}\neffective_to: {raw}")
    [doc] = load_documents([path])
    assert doc.visibility.effective_from == doc.visibility.effective_to == dt.date(2024, 3, 5)


def test_jsonl_with_several_documents(tmp_path: Path) -> None:
    path = jsonl(
        tmp_path / "docs.jsonl",
        [
            {**GOOD, "doc_id": "a", "text": "Alpha."},
            "",
            {**GOOD, "doc_id": "b", "version": 3, "uri": "https://x/b", "text": "# Bee\nBravo."},
            {**GOOD, "doc_id": "c", "text": "Line\u2028separator inside one JSON line."},
        ],
    )
    docs = load_documents([path])
    assert [(d.doc_id, d.version, d.source) for d in docs] == [
        ("a", "1", f"{path}:1"),
        ("b", "3", f"{path}:3"),
        ("c", "1", f"{path}:4"),
    ]
    assert [d.uri for d in docs] == ["", "https://x/b", ""]
    assert [d.title for d in docs] == ["a", "Bee", "c"]
    assert docs[2].text == "Line\u2028separator inside one JSON line."


def test_directories_are_read_recursively_in_sorted_order(tmp_path: Path) -> None:
    md_fields(tmp_path / "b.md", {**GOOD, "doc_id": "b"})
    md_fields(tmp_path / "a" / "z.markdown", {**GOOD, "doc_id": "z"})
    md_fields(tmp_path / "a" / "deep" / "y.txt", {**GOOD, "doc_id": "y"})
    jsonl(tmp_path / "c.jsonl", [{**GOOD, "doc_id": "j", "text": "Jay."}])
    write(tmp_path / "notes.docx", "not a document")
    write(tmp_path / "a" / "README", "not a document either")
    (tmp_path / "dir.md").mkdir()  # a directory with a document suffix is not a file
    assert [d.doc_id for d in load_documents([tmp_path])] == ["y", "z", "b", "j"]


def test_a_file_named_twice_is_read_once(tmp_path: Path) -> None:
    path = md_fields(tmp_path / "a.md", GOOD)
    assert len(load_documents([tmp_path, path])) == 1


def test_version_int_becomes_string(tmp_path: Path) -> None:
    [doc] = load_documents([md(tmp_path / "v.md", "version: 7\n" + _front(GOOD))])
    assert doc.version == "7"
    assert doc.label == "refunds@7"


def test_title_from_first_heading_outside_code_else_doc_id(tmp_path: Path) -> None:
    body = "Intro.\n\n```sh\n# install first\n```\n\n# Refund policy #\n\n# Second\n"
    [doc] = load_documents([md_fields(tmp_path / "a.md", GOOD, body)])
    assert doc.title == "Refund policy"
    [doc] = load_documents([md_fields(tmp_path / "b.md", GOOD, "No heading.\n## Sub only\n")])
    assert doc.title == "refunds"
    [doc] = load_documents([md_fields(tmp_path / "c.md", {**GOOD, "title": "Given"}, body)])
    assert doc.title == "Given"


def test_unknown_fields_are_ignored_and_override_nothing(tmp_path: Path) -> None:
    fields = {**GOOD, "owner": "ann", "text": "FAKE BODY", "source": "elsewhere", "key": "x@9"}
    [doc] = load_documents([md_fields(tmp_path / "a.md", fields, "Real body.\n")])
    assert doc.text == "Real body.\n"
    assert doc.source == str(tmp_path / "a.md")
    assert doc.label == "refunds@1"
    record = {**GOOD, "text": "FAKE BODY", "source": "elsewhere"}
    assert parse_record(record, "Real body.", "src:1", "").text == "Real body."


def test_parse_record_directly() -> None:
    doc = parse_record({**GOOD, "version": 4}, "# T\nbody", "docs.jsonl:9", "https://u")
    assert (doc.label, doc.title, doc.uri) == ("refunds@4", "T", "https://u")
    assert doc.source == "docs.jsonl:9"
    with pytest.raises(DocumentsRefused) as info:
        parse_record({**GOOD, "acl": []}, "body", "docs.jsonl:9", "")
    assert [(p.source, p.field) for p in info.value.problems] == [("docs.jsonl:9", "acl")]


# --- what is refused ----------------------------------------------------------------------


def _front(fields: dict[str, Any]) -> str:
    return "\n".join(f"{k}: {json.dumps(v)}" for k, v in fields.items())


@pytest.mark.parametrize("field", ["doc_id", "tenant", "region", "acl", "effective_from"])
def test_each_required_field_missing_is_named_with_the_file(tmp_path: Path, field: str) -> None:
    fields = {k: v for k, v in GOOD.items() if k != field}
    path = md_fields(tmp_path / "a.md", fields)
    problems = refused([path])
    assert where(problems) == {(str(path), field)}
    null = md_fields(tmp_path / "null.md", {**GOOD, field: None})
    assert where(refused([null])) == {(str(null), field)}


@pytest.mark.parametrize("field", ["doc_id", "tenant", "region", "acl", "effective_from"])
def test_each_required_field_missing_in_jsonl_names_the_line(tmp_path: Path, field: str) -> None:
    fields = {k: v for k, v in GOOD.items() if k != field}
    path = jsonl(
        tmp_path / "docs.jsonl",
        [{**GOOD, "doc_id": "ok", "text": "fine"}, "", {**fields, "text": f"x {BODY_SECRET}"}],
    )
    assert where(refused([path])) == {(f"{path}:3", field)}


@pytest.mark.parametrize(
    "raw",
    [
        '"2024-13-01"',
        '"2024-02-30"',
        '"01/02/2024"',
        '"2024-1-1"',
        '"2024-01-01T00:00:00"',
        '" 2024-01-01"',
        '"2024-01-01\\n"',
        '"２０２４-01-01"',  # fullwidth digits are digits to \d, not to YYYY-MM-DD
        "2024-01-01 10:30:00",  # a YAML timestamp: has a time of day
        "20240101",  # a YAML int
        '"20240101"',  # ISO 8601 basic format: date.fromisoformat accepts it, we do not
        '"2024-W01-1"',  # ISO week date, likewise
        "true",
        '""',
        "[2024-01-01]",
    ],
)
def test_unparseable_date_is_refused(tmp_path: Path, raw: str) -> None:
    path = md(
        tmp_path / "a.md",
        _front({k: v for k, v in GOOD.items() if k != "effective_from"})
        + f"\neffective_from: {raw}",
    )
    [problem] = refused([path])
    assert (problem.source, problem.field) == (str(path), "effective_from")
    assert "YYYY-MM-DD" in problem.message


def test_unparseable_effective_to_is_refused_not_open(tmp_path: Path) -> None:
    path = md_fields(tmp_path / "a.md", {**GOOD, "effective_to": "someday"})
    assert where(refused([path])) == {(str(path), "effective_to")}


@pytest.mark.parametrize(
    ("acl", "says"),
    [
        ([], "non-empty list"),
        ("group:staff", "list"),
        ({"group": "staff"}, "list"),
        (["staff"], "kind:name"),
        (["group:staff", ":nobody"], "kind:name"),
        (["group:"], "kind:name"),
        (["group:staff", ""], "empty"),
        (["group:staff", 7], "string"),
        (["group:staff", None], "required"),
    ],
)
def test_acl_must_be_a_non_empty_list_of_prefixed_principals(
    tmp_path: Path, acl: Any, says: str
) -> None:
    path = md_fields(tmp_path / "a.md", {**GOOD, "acl": acl})
    problems = refused([path])
    assert where(problems) == {(str(path), "acl")}
    assert says in problems[-1].message


def test_bare_acl_entry_message_shows_the_expected_form(tmp_path: Path) -> None:
    [problem] = refused([md_fields(tmp_path / "a.md", {**GOOD, "acl": ["staff"]})])
    assert "'staff'" in problem.message and "group:sales" in problem.message


def test_effective_to_before_effective_from(tmp_path: Path) -> None:
    path = md_fields(tmp_path / "a.md", {**GOOD, "effective_to": "2023-12-31"})
    [problem] = refused([path])
    assert (problem.field, problem.source) == ("effective_to", str(path))
    assert "2023-12-31" in problem.message and "2024-01-01" in problem.message
    one_day = md_fields(tmp_path / "b.md", {**GOOD, "doc_id": "b", "effective_to": "2024-01-01"})
    assert load_documents([one_day])[0].visibility.effective_to == dt.date(2024, 1, 1)


def test_duplicate_key_in_batch_names_both_sources(tmp_path: Path) -> None:
    first = md_fields(tmp_path / "a.md", {**GOOD, "version": "2"})
    second = jsonl(tmp_path / "b.jsonl", [{**GOOD, "version": 2, "text": "again"}])
    other_version = md_fields(tmp_path / "c.md", {**GOOD, "version": "3"})
    [problem] = refused([tmp_path])
    assert problem.source == f"{second}:1"
    assert "refunds@2" in problem.message and str(first) in problem.message
    assert len(load_documents([first, other_version])) == 2


@pytest.mark.parametrize("front", ["acl: [group:staff]\nacl: [group:all]", "tenant: a\ntenant: b"])
def test_duplicate_yaml_field_is_refused_not_last_wins(tmp_path: Path, front: str) -> None:
    rest = {k: v for k, v in GOOD.items() if k not in ("acl", "tenant")}
    [problem] = refused([md(tmp_path / "a.md", _front(rest) + "\n" + front)])
    assert problem.field == "front_matter" and "duplicate key" in problem.message


def test_duplicate_json_field_is_refused(tmp_path: Path) -> None:
    line = json.dumps({**GOOD, "text": "x"})[:-1] + ', "acl": ["group:all"]}'
    [problem] = refused([jsonl(tmp_path / "d.jsonl", [line])])
    assert (problem.field, problem.message) == ("json", "duplicate key 'acl'")


def test_all_problems_are_reported_at_once(tmp_path: Path) -> None:
    bad = md_fields(
        tmp_path / "bad.md",
        {"doc_id": "x", "region": "EU", "acl": "group:staff", "effective_from": "soon"},
        body="   \n",
    )
    lines = jsonl(
        tmp_path / "docs.jsonl",
        [{**GOOD, "doc_id": "fine", "text": "ok"}, "{not json", {**GOOD, "tenant": ""}],
    )
    no_front = write(tmp_path / "plain.txt", f"Just text {BODY_SECRET}.\n")
    problems = refused([tmp_path])
    assert where(problems) == {
        (str(bad), "tenant"),
        (str(bad), "acl"),
        (str(bad), "effective_from"),
        (str(bad), "text"),
        (f"{lines}:2", "json"),
        (f"{lines}:3", "tenant"),
        (f"{lines}:3", "text"),
        (str(no_front), "front_matter"),
    }


def test_refusal_lists_one_problem_per_line(tmp_path: Path) -> None:
    a = md_fields(tmp_path / "a.md", {**GOOD, "acl": []})
    b = md_fields(tmp_path / "b.md", {**GOOD, "doc_id": "b", "region": ""})
    with pytest.raises(DocumentsRefused) as info:
        load_documents([a, b])
    assert str(info.value).splitlines() == [
        f"{p.source}: {p.field}: {p.message}" for p in info.value.problems
    ]
    assert [line.split(": ")[:2] for line in str(info.value).splitlines()] == [
        [str(a), "acl"],
        [str(b), "region"],
    ]


@pytest.mark.parametrize("field", ["doc_id", "version", "tenant", "region", "acl"])
@pytest.mark.parametrize("char", ["\x00", "\x1b", "\n", "\t", "\x7f", "\x85"])
def test_control_characters_in_identifiers_are_refused(
    tmp_path: Path, field: str, char: str
) -> None:
    value: Any = f"group:st{char}aff" if field == "acl" else f"val{char}ue"
    path = jsonl(
        tmp_path / "d.jsonl",
        [{**GOOD, field: [value] if field == "acl" else value, "text": "body"}],
    )
    [problem] = refused([path])
    assert (problem.source, problem.field) == (f"{path}:1", field)
    assert char not in problem.message  # shown escaped, so the message stays one line


@pytest.mark.parametrize("field", ["text", "title"])
def test_a_nul_in_the_text_or_title_is_refused(tmp_path: Path, field: str) -> None:
    """SQLite stored it and PostgreSQL refused it: a push accepted (202) became a job
    failed by the writer (DataError) on one catalog only. Refused on every one now."""
    record = {**GOOD, "text": "body", field: "bo\x00dy"}
    [problem] = refused([jsonl(tmp_path / "d.jsonl", [record])])
    assert problem.field == field and "NUL" in problem.message


@pytest.mark.parametrize(
    ("version", "says"),
    [("1@2", "'@'"), ("a:b", "'@'"), ("v/2", "'@'"), ("1 0", "'@'"), ("", "empty")],
)
def test_bad_versions_are_refused(tmp_path: Path, version: Any, says: str) -> None:
    [problem] = refused([md_fields(tmp_path / "a.md", {**GOOD, "version": version})])
    assert problem.field == "version" and says in problem.message


@pytest.mark.parametrize("value", ["   ", " acme", "acme ", 5, ["acme"]])
def test_blank_padded_or_non_string_identifiers_are_refused(tmp_path: Path, value: Any) -> None:
    path = md_fields(tmp_path / "a.md", {**GOOD, "tenant": value})
    assert where(refused([path])) == {(str(path), "tenant")}


@pytest.mark.parametrize(
    "content",
    [
        "No front matter at all.\n",
        "---\ndoc_id: a\nnever closed\n",
        "\n---\ndoc_id: a\n---\nbody\n",
        "",
    ],
)
def test_missing_front_matter_is_refused(tmp_path: Path, content: str) -> None:
    path = write(tmp_path / "a.md", content)
    assert where(refused([path])) == {(str(path), "front_matter")}


def test_invalid_yaml_names_the_line_but_not_the_content(tmp_path: Path) -> None:
    path = write(tmp_path / "a.md", f"---\ndoc_id: a\n  {BODY_SECRET}: [\n---\nbody\n")
    [problem] = refused([path])
    assert problem.field == "front_matter" and "line 3" in problem.message


@pytest.mark.parametrize("front", ["- a list\n- not a mapping", "just a string", "# comment"])
def test_front_matter_must_be_a_mapping(tmp_path: Path, front: str) -> None:
    path = md(tmp_path / "a.md", front)
    assert where(refused([path])) == {(str(path), "front_matter")}


def test_non_object_json_lines_are_refused(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "d.jsonl", ["[1, 2]", '"text"', "null", "{broken"])
    assert where(refused([path])) == {(f"{path}:{n}", "json") for n in (1, 2, 3, 4)}


@pytest.mark.parametrize("text", [None, "", " \n\t", 42])
def test_jsonl_body_must_be_non_empty_text(tmp_path: Path, text: Any) -> None:
    record = {**GOOD, "text": text} if text is not None else dict(GOOD)
    path = jsonl(tmp_path / "d.jsonl", [record])
    assert where(refused([path])) == {(f"{path}:1", "text")}


@pytest.mark.parametrize(
    ("text", "kind"),
    [("5", "int"), ('["a"]', "list"), ('{"a": 1}', "dict"), ("true", "bool"), ("NaN", "float")],
)
def test_a_jsonl_body_not_a_string_names_its_type(tmp_path: Path, text: str, kind: str) -> None:
    """It was refused as "the document body is missing or empty": a body was there."""
    line = json.dumps(GOOD)[:-1] + f', "text": {text}}}'
    path = jsonl(tmp_path / "d.jsonl", [line])
    result = CliRunner().invoke(cli, ["ingest", str(path), "--data-dir", str(tmp_path / "data")])
    assert result.exit_code == 1, result.output
    assert f"{path}:1: text: must be a string, got {kind}" in result.output
    assert "missing or empty" not in result.output


def test_empty_markdown_body_is_refused(tmp_path: Path) -> None:
    path = md_fields(tmp_path / "a.md", GOOD, body="\n  \n")
    assert where(refused([path])) == {(str(path), "text")}


def test_unsupported_missing_and_undecodable_files(tmp_path: Path) -> None:
    pdf = write(tmp_path / "x.pdf", "%PDF")
    missing = tmp_path / "missing.md"
    typo = tmp_path / "no-such-dir"
    latin1 = tmp_path / "latin1.md"
    latin1.write_bytes(b"---\ndoc_id: caf\xe9\n---\nbody\n")
    problems = refused([pdf, missing, typo, latin1])
    assert where(problems) == {
        (str(pdf), "file"),
        (str(missing), "file"),
        (str(typo), "file"),
        (str(latin1), "file"),
    }


def test_byte_order_mark_and_crlf_are_tolerated(tmp_path: Path) -> None:
    path = tmp_path / "bom.md"
    path.write_bytes(
        ("\ufeff---\r\n" + _front(GOOD).replace("\n", "\r\n") + "\r\n---\r\nBody\r\n").encode()
    )
    [doc] = load_documents([path])
    assert doc.text == "Body\n" and doc.doc_id == "refunds"


def test_a_folder_that_cannot_be_listed_refuses_the_read_not_drops_its_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subfolder the OS will not list (permissions, a stale network mount) must not read
    as a folder without files: `gateway sync` would delete every document it held."""
    meta = {**STAFF_EU, "effective_from": "2020-01-01"}
    write_doc(tmp_path / "share", "a.md", {"doc_id": "a", **meta}, "Kept.")
    write_doc(tmp_path / "share" / "sub", "b.md", {"doc_id": "b", **meta}, "Unlisted.")
    assert {d.doc_id for d in load_documents([tmp_path / "share"])} == {"a", "b"}
    scandir = os.scandir

    def failing(path: Any = ".") -> Any:
        if Path(path).name == "sub":
            raise OSError(errno.EIO, "Input/output error", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", failing)  # the OS's answer, not the gateway's code
    with pytest.raises(DocumentsRefused) as refused:
        load_documents([tmp_path / "share"])
    (problem,) = refused.value.problems
    assert problem.source.endswith("sub") and problem.field == "folder"
    assert "cannot be listed (Input/output error)" in problem.message


@pytest.mark.parametrize("field", ["doc_id", "title", "text"])
def test_a_lone_surrogate_is_refused_naming_its_field(tmp_path: Path, field: str) -> None:
    """Half of a UTF-16 pair (JSON's `\\ud800` alone) was taken; the model then failed on
    it (a TypeError naming nothing), after the model had loaded, and `gateway sync`
    crashed sending it."""
    record = {**GOOD, "text": "body", field: "half \ud800 of a pair"}
    [problem] = refused([jsonl(tmp_path / "d.jsonl", [record])])
    assert problem.field == field and "surrogate" in problem.message


def test_surrogate_pairs_written_as_escapes_are_one_character(tmp_path: Path) -> None:
    """YAML reads a JSON-style `"\\ud83d\\ude00"` as two halves; they are one emoji. And a
    sidecar in JSON is read as JSON: a tab-indented one (as `jq --tab` writes it) was
    refused as invalid YAML."""
    md(tmp_path / "a.md", _front({**GOOD, "doc_id": "a"}) + '\ntitle: "Smile \\ud83d\\ude00"')
    (tmp_path / "b.txt").write_text("A plain note.\n")
    sidecar = {**GOOD, "doc_id": "b", "title": "Wink \ud83d\ude09"}
    (tmp_path / "b.txt.meta.json").write_text(json.dumps(sidecar, indent="\t"))
    docs = {d.doc_id: d for d in load_documents([tmp_path])}
    assert docs["a"].title == "Smile \U0001f600" and docs["b"].title == "Wink \U0001f609"


def test_a_jsonl_line_nested_too_deeply_is_refused(tmp_path: Path) -> None:
    """Python's parser recursed once a level: a RecursionError traceback."""
    [problem] = refused([jsonl(tmp_path / "d.jsonl", ["[" * 100_000 + "]" * 100_000])])
    assert problem.field == "json" and "nested too deeply" in problem.message
