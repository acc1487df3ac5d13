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

    lexical = LexicalIndex(tmp_path)
    in_force = [_dated(i, dt.date(2020, 1, 1), None) for i in range(40)]
    lexical.apply([], in_force)
    caller = Restriction("acme", frozenset({"group:a"}), frozenset({"EU"}), TODAY)

    def seen(restriction: Restriction = caller) -> set[str]:
        return _seen(lexical, restriction)

    everything = {c.chunk_id for c in in_force}
    assert seen() == everything  # the rules are idle here, and asked once
    later = _dated(40, TODAY + dt.timedelta(days=1), None)
    ended = _dated(41, dt.date(2020, 1, 1), TODAY - dt.timedelta(days=1))
    elsewhere = _dated(42, dt.date(2020, 1, 1), None, region="US")
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
    lexical.apply([], [_dated(43, dt.date(2018, 1, 1), dt.date(2019, 6, 1))])
    assert seen(long_ago) == {"d43@1:0"}


def test_a_region_rule_idle_for_some_regions_is_kept_for_others(tmp_path: Path) -> None:
    """Whether the region rule is idle is asked per set of regions: a caller reading EU
    and US, for whom it is idle, asking first, must not let an EU caller see US."""
    lexical = LexicalIndex(tmp_path)
    eu = [_dated(i, dt.date(2020, 1, 1), None) for i in range(20)]
    us = _dated(20, dt.date(2020, 1, 1), None, region="US")
    lexical.apply([], [*eu, us])
    both = Restriction("acme", frozenset({"group:a"}), frozenset({"EU", "US"}), TODAY)
    only_eu = Restriction("acme", frozenset({"group:a"}), frozenset({"EU"}), TODAY)
    assert _seen(lexical, both) == {c.chunk_id for c in [*eu, us]}
    assert _seen(lexical, only_eu) == {c.chunk_id for c in eu}


def test_the_days_at_the_edges_of_validity_as_a_mustnot_keeps_them(tmp_path: Path) -> None:
    """With a few documents out of force (the MustNot over them), one that ends on
    `as_of` or starts on it is in force; one that ended the day before is not."""
    lexical = LexicalIndex(tmp_path)
    always = [_dated(i, dt.date(2020, 1, 1), None) for i in range(20)]
    ends_today = _dated(20, dt.date(2020, 1, 1), TODAY)
    ended = _dated(21, dt.date(2020, 1, 1), TODAY - dt.timedelta(days=1))
    starts_today = _dated(22, TODAY, None)
    starts_tomorrow = _dated(23, TODAY + dt.timedelta(days=1), None)
    lexical.apply([], [*always, ends_today, ended, starts_today, starts_tomorrow])
    caller = Restriction("acme", frozenset({"group:a"}), frozenset({"EU"}), TODAY)
    assert _seen(lexical, caller) == {c.chunk_id for c in [*always, ends_today, starts_today]}


def test_a_partition_with_an_undated_document_keeps_its_date_rules(tmp_path: Path) -> None:
    """Every document is written with both dates; one without them (another writer, an
    index damaged) would pass a date rule left out or a MustNot: such a partition keeps
    the rules that exclude it."""
    import tantivy

    from gateway.storage import lexical as engine
    from gateway.storage.partitions import partition_name

    lexical = LexicalIndex(tmp_path)
    lexical.apply([], [_dated(i, dt.date(2020, 1, 1), None) for i in range(30)])
    path = tmp_path / partition_name("acme")
    written = tantivy.Index.open(str(path))
    written.register_tokenizer(engine.PROSE, engine._prose_analyzer())
    written.register_tokenizer(engine.CODES, engine._codes_analyzer())
    writer = written.writer(heap_size=15_000_000, num_threads=1)
    undated = {"chunk_id": "undated@1:0", "doc_id": "undated", "version": "1", "uri": ""}
    scope = {"tenant": "acme", "region": "EU", "acl": ["group:a"], "doc_key": "undated"}
    writer.add_document(tantivy.Document(**undated, **scope, title="t", text="refund rule"))
    writer.commit()
    writer.wait_merging_threads()
    partition = engine.TantivyIndex(path, create=False)
    caller = Restriction("acme", frozenset({"group:a"}), frozenset({"EU"}), TODAY)
    assert partition.count() == 31
    found = {h.chunk_id for h in partition.search(caller, "refund", 100)}
    assert len(found) == 30 and "undated@1:0" not in found
    assert partition.filter_only(caller) == found


def _dated(i: int, start: dt.date, end: dt.date | None, region: str = "EU") -> Chunk:
    v = Visibility("acme", region, ("group:a",), start, end)
    return Chunk(f"d{i}@1:0", f"d{i}", "1", 0, "t", "", f"refund rule {i}", 3, v)


def _seen(lexical: LexicalIndex, restriction: Restriction) -> set[str]:
    """What chunk search, whole-document search, fetch and the filter alone admit: the
    same, or the test fails."""
    by_chunk = {h.chunk_id for h in lexical.search(restriction, "refund", 100)}
    whole = {h.chunk_id for h in lexical.search_documents(restriction, "refund", 100) or []}
    shown = set(lexical.fetch(restriction, [f"d{i}@1:0" for i in range(60)]))
    assert by_chunk == whole == shown == lexical.filter_only(restriction)
    return by_chunk
