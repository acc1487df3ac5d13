"""What the lexical analysis treats as an identifier, and that user syntax is inert."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest

from gateway.domain import Chunk, Visibility
from gateway.restriction import Restriction
from gateway.storage.partitions import LexicalIndex

TODAY = dt.date(2026, 1, 1)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> LexicalIndex:
    return LexicalIndex(tmp_path_factory.mktemp("lex"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What does RPL-14 say?", ["rpl-14"]),
        ("CVE-2024-3094 and INV-00042.", ["cve-2024-3094", "inv-00042"]),
        ("paper size A4 on 2024-01-01", ["a4", "2024-01-01"]),
        ("in 1973 the e-mail rule", []),  # plain numbers and words are prose
        ("title:(a acl:x *", []),
    ],
)
def test_identifiers(index: LexicalIndex, text: str, expected: list[str]) -> None:
    assert index.identifiers(text) == expected


@pytest.mark.parametrize("extra_principals", [0, 300])  # short lists and the term-set path
def test_filter_and_fetch_hold_for_short_and_long_principal_lists(
    tmp_path: Path, extra_principals: int
) -> None:
    def chunk(i: int, acl: str) -> Chunk:
        v = Visibility("acme", "EU", (acl,), dt.date(2020, 1, 1), None)
        return Chunk(f"d{i}@1:0", f"d{i}", "1", 0, "t", "", f"refund rule {i}", 3, v)

    lexical = LexicalIndex(tmp_path)
    lexical.apply([], [chunk(i, f"group:g{i % 3}") for i in range(300)])
    filler = [f"user:u{n}" for n in range(extra_principals)]
    caller = Restriction("acme", frozenset({"group:g0", *filler}), frozenset({"EU"}), TODAY)
    visible = {f"d{i}@1:0" for i in range(0, 300, 3)}
    assert lexical.filter_only(caller) == visible
    assert {h.chunk_id for h in lexical.search(caller, "refund", 300)} == visible
    every_id = [f"d{i}@1:0" for i in range(300)]  # 300 IDs: the term-set path for IDs too
    assert set(lexical.fetch(caller, every_id)) == visible
    assert set(lexical.fetch(caller, every_id[:30])) == visible & set(every_id[:30])


def test_another_tenants_documents_change_no_score_or_order(tmp_path: Path) -> None:
    """BM25 statistics are the tenant's own: 50 of another tenant's chunks full of the
    query's words leave every score and the order of a caller's results exactly as they
    were (in one shared index, a score ratio moved from 1.0 to 6.1)."""

    def chunk(tenant: str, i: int, text: str) -> Chunk:
        v = Visibility(tenant, "EU", ("group:staff",), dt.date(2020, 1, 1), None)
        return Chunk(f"d{i}@1:0", f"d{i}", "1", 0, "t", "", text, 8, v)

    acme = Restriction("acme", frozenset({"group:staff"}), frozenset({"EU"}), TODAY)
    lexical = LexicalIndex(tmp_path)
    lexical.apply(
        [],
        [
            chunk("acme", 0, "Refunds are paid within five days."),
            chunk("acme", 1, "Shipping is free; refunds for shipping are not paid."),
            chunk("acme", 2, "Warranty claims need the receipt."),
        ],
    )
    query = "refund shipping warranty"
    before = [(h.chunk_id, h.score) for h in lexical.search(acme, query, 10)]
    noise = [chunk("globex", 100 + i, "refund refund shipping policy") for i in range(50)]
    lexical.apply([], noise)
    assert [(h.chunk_id, h.score) for h in lexical.search(acme, query, 10)] == before
    assert lexical.count() == 53  # the other tenant's chunks are indexed, in their own place


@pytest.mark.sleeps
def test_an_open_partition_writes_nothing_behind_our_back(tmp_path: Path) -> None:
    """An open partition leaves its directory as it is: erasure removes old copies that a
    server still holds open, and Tantivy's default reader, on seeing meta.json change,
    reopened the index from a thread and wrote its lock file back into the directory
    being removed (CI: "Directory not empty" while a test removed its index)."""
    v = Visibility("acme", "EU", ("group:staff",), dt.date(2020, 1, 1), None)
    lexical = LexicalIndex(tmp_path)
    lexical.apply([], [Chunk("d0@1:0", "d0", "1", 0, "t", "", "refunds", 1, v)])
    acme = Restriction("acme", frozenset({"group:staff"}), frozenset({"EU"}), TODAY)
    assert [h.chunk_id for h in lexical.search(acme, "refunds", 10)] == ["d0@1:0"]
    partitions = [d for d in tmp_path.iterdir() if d.is_dir()]
    for directory in partitions:  # as a removal takes the files before the directory
        (directory / ".tantivy-meta.lock").unlink(missing_ok=True)
        meta = directory / "meta.json"
        meta.write_text(meta.read_text() + " ")
    time.sleep(1.2)  # Tantivy's watcher looks every 500 ms
    assert [p for d in partitions if (p := d / ".tantivy-meta.lock").exists()] == []


def test_rules_no_document_fails_are_dropped_only_while_that_holds(tmp_path: Path) -> None:
    """A partition drops the region and date rules none of its documents can fail (all in
    force, all in the caller's region). Each commit is asked anew: a document that starts
    later, has ended, or sits in another region, added after searches found the rules
    idle, is kept out of chunk and whole-document searches, and out of `fetch`; a day on
    which most documents are out of force keeps them out too."""

    def chunk(i: int, region: str, start: dt.date, end: dt.date | None) -> Chunk:
        v = Visibility("acme", region, ("group:a",), start, end)
        return Chunk(f"d{i}@1:0", f"d{i}", "1", 0, "t", "", f"refund rule {i}", 3, v)

    lexical = LexicalIndex(tmp_path)
    in_force = [chunk(i, "EU", dt.date(2020, 1, 1), None) for i in range(40)]
    lexical.apply([], in_force)
    caller = Restriction("acme", frozenset({"group:a"}), frozenset({"EU"}), TODAY)

    def seen(restriction: Restriction = caller) -> set[str]:
        by_chunk = {h.chunk_id for h in lexical.search(restriction, "refund", 100)}
        whole = {h.chunk_id for h in lexical.search_documents(restriction, "refund", 100) or []}
        shown = set(lexical.fetch(restriction, [f"d{i}@1:0" for i in range(60)]))
        assert by_chunk == whole == shown == lexical.filter_only(restriction)
        return by_chunk

    everything = {c.chunk_id for c in in_force}
    assert seen() == everything  # the rules are idle here, and asked once
    later = chunk(40, "EU", TODAY + dt.timedelta(days=1), None)
    ended = chunk(41, "EU", dt.date(2020, 1, 1), TODAY - dt.timedelta(days=1))
    elsewhere = chunk(42, "US", dt.date(2020, 1, 1), None)
    lexical.apply([], [later, ended, elsewhere])
    assert seen() == everything  # a few kept out: each rule is back
    tomorrow = Restriction(
        "acme", frozenset({"group:a"}), frozenset({"EU"}), later.visibility.effective_from
    )
    assert seen(tomorrow) == everything | {later.chunk_id}
    both = Restriction("acme", frozenset({"group:a"}), frozenset({"EU", "US"}), TODAY)
    assert seen(both) == everything | {elsewhere.chunk_id}
    # Most documents out of force on the day asked: the other way of keeping them out.
    long_ago = Restriction("acme", frozenset({"group:a"}), frozenset({"EU"}), dt.date(2019, 1, 1))
    assert seen(long_ago) == set()
    lexical.apply([], [chunk(43, "EU", dt.date(2018, 1, 1), dt.date(2019, 6, 1))])
    assert seen(long_ago) == {"d43@1:0"}
