"""Both engine filters select exactly what the reference predicate `visible()` admits."""

from __future__ import annotations

import datetime as dt
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.domain import Chunk, Visibility, version_key
from gateway.restriction import Decision, Restriction, decide, visible
from gateway.storage.flat import FlatVectors
from gateway.storage.partitions import LexicalIndex
from gateway.storage.vectors import VectorStore
from tests.helpers.properties import examples

BASE = dt.date(2024, 1, 1)
TENANTS = ["acme", "globex", "o'hara"]
REGIONS = ["EU", "US", "GLOBAL", "ap-south"]
PRINCIPALS = [
    "group:a",
    "group:b",
    "user:x",
    "support:eu",
    "group:q'\"uote",
    "group:a b",
    "group:%",
    "group:_",
]

days = st.integers(min_value=-5, max_value=5).map(lambda n: BASE + dt.timedelta(days=n))


@st.composite
def visibilities(draw: st.DrawFn) -> Visibility:
    start = draw(days)
    length = draw(st.none() | st.integers(min_value=0, max_value=4))
    return Visibility(
        tenant=draw(st.sampled_from(TENANTS)),
        region=draw(st.sampled_from(REGIONS)),
        acl=tuple(draw(st.lists(st.sampled_from(PRINCIPALS), min_size=1, max_size=3, unique=True))),
        effective_from=start,
        effective_to=None if length is None else start + dt.timedelta(days=length),
    )


restrictions = st.builds(
    Restriction,
    tenant=st.sampled_from(TENANTS),
    principals=st.frozensets(st.sampled_from(PRINCIPALS), max_size=4),
    regions=st.frozensets(st.sampled_from(REGIONS), max_size=3),
    as_of=days,
)


def chunk(i: int, v: Visibility) -> Chunk:
    return Chunk(f"d{i}@1:0", f"d{i}", "1", 0, "t", "", f"text {i}", 2, v)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    metas=st.lists(visibilities(), min_size=1, max_size=25),
    asks=st.lists(restrictions, min_size=1, max_size=6),
    revised=st.lists(visibilities(), max_size=8),
)
def test_engine_filters_equal_reference_predicate(
    metas: list[Visibility], asks: list[Restriction], revised: list[Visibility]
) -> None:
    chunks = [chunk(i, v) for i, v in enumerate(metas)]
    with tempfile.TemporaryDirectory() as tmp:
        lexical = LexicalIndex(Path(tmp) / "lex")
        lexical.apply([], chunks)
        # Whole documents (document_bm25) are restricted inside Tantivy too, also after
        # their visibility is revised (a document of another tenant moves partitions).
        whole = LexicalIndex(Path(tmp) / "whole")
        whole.apply([], chunks)
        changed = [chunk(i, v) for i, v in enumerate(revised)]
        whole.apply(
            [version_key(c.visibility.tenant, c.doc_id, "1") for c in chunks[: len(changed)]],
            changed,
        )
        now = {c.chunk_id: c for c in [*changed, *chunks[len(changed) :]]}
        for asked in asks:
            for restriction in (asked, asked.narrowed_to(frozenset(PRINCIPALS))):
                found = whole.search_documents(restriction, "text", 100) or []
                expected = {i for i, c in now.items() if visible(restriction, c.visibility)}
                assert {h.chunk_id for h in found} == expected
        vectors = VectorStore(Path(tmp) / "vec", dim=4)
        rng = np.random.default_rng(0)
        vectors.apply([], chunks, rng.random((len(chunks), 4), dtype=np.float32), {})
        flat = FlatVectors.build(vectors.snapshot())
        in_use = frozenset(p for v in metas for p in v.acl)
        for asked in asks:
            expected = {c.chunk_id for c in chunks if visible(asked, c.visibility)}
            # As search runs it: narrowed to the principals some ACL names.
            for restriction in (asked, asked.narrowed_to(in_use)):
                assert lexical.filter_only(restriction) == expected
                assert vectors.filter_only(restriction) == expected
                rows = flat.permitted_rows(restriction)
                assert {flat.chunk_id(r) for r in rows} == expected
                query = rng.random(4)
                ranked = {h.chunk_id for h in vectors.search(restriction, query, 100)}
                assert ranked == expected  # top-k over the filter, not a post-filtered top-k
                for kind in ("mean", "first"):  # document_vector: permitted documents only
                    whole = flat.search_documents(rows, query, 100, kind)
                    assert {h.chunk_id for h in whole} == expected
                exact = flat.search(rows, query, 3)
                lance = vectors.search(restriction, query, 3)
                assert [round(h.distance, 4) for h in exact] == [
                    round(h.distance, 4) for h in lance
                ]
        # Asked again in another order: the cache of permitted rows answers each exactly.
        for asked in reversed(asks):
            expected = {c.chunk_id for c in chunks if visible(asked, c.visibility)}
            rows = flat.permitted_rows(asked)
            assert {flat.chunk_id(r) for r in rows} == expected and not rows.flags.writeable


def test_empty_principals_is_never_no_filter() -> None:
    v = Visibility("acme", "EU", ("group:a",), BASE, None)
    empty = Restriction("acme", frozenset(), frozenset({"EU"}), BASE)
    assert not visible(empty, v)
    with tempfile.TemporaryDirectory() as tmp:
        lexical = LexicalIndex(Path(tmp) / "lex")
        lexical.apply([], [chunk(0, v)])
        assert lexical.filter_only(empty) == set()
        assert lexical.search(empty, "text", 10) == []


ALLOWED = Visibility("acme", "EU", ("group:a",), BASE, None)


@pytest.mark.parametrize(
    ("restriction", "meta", "rule"),
    [
        # One row per rule, then rows where several fail: the first in this order decides.
        (Restriction("acme", frozenset(), frozenset({"EU"}), BASE), ALLOWED, "no_principals"),
        (Restriction("globex", frozenset({"group:a"}), frozenset({"EU"}), BASE), ALLOWED, "tenant"),
        (Restriction("acme", frozenset({"group:a"}), frozenset({"US"}), BASE), ALLOWED, "region"),
        (Restriction("acme", frozenset({"group:b"}), frozenset({"EU"}), BASE), ALLOWED, "acl"),
        (
            Restriction("acme", frozenset({"group:a"}), frozenset({"EU"}), BASE - dt.timedelta(1)),
            ALLOWED,
            "effective_from",
        ),
        (
            Restriction("acme", frozenset({"group:a"}), frozenset({"EU"}), BASE + dt.timedelta(1)),
            Visibility("acme", "EU", ("group:a",), BASE - dt.timedelta(9), BASE),
            "effective_to",
        ),
        (Restriction("globex", frozenset({"group:b"}), frozenset({"US"}), BASE), ALLOWED, "tenant"),
        (Restriction("acme", frozenset({"group:b"}), frozenset({"US"}), BASE), ALLOWED, "region"),
        (
            Restriction("acme", frozenset({"group:b"}), frozenset({"EU"}), BASE - dt.timedelta(1)),
            ALLOWED,
            "acl",
        ),
    ],
)
def test_decision_table(restriction: Restriction, meta: Visibility, rule: str) -> None:
    decision = decide(restriction, meta)
    assert (decision.visible, decision.rule) == (False, rule)


def test_allowed_names_the_matching_principals() -> None:
    ask = Restriction("acme", frozenset({"group:a", "group:z"}), frozenset({"EU"}), BASE)
    assert decide(ask, ALLOWED) == Decision(True, "acl", ("group:a",))


@settings(max_examples=examples(300), deadline=None)
@given(meta=visibilities(), restriction=restrictions)
def test_decide_allows_exactly_when_every_rule_holds(
    meta: Visibility, restriction: Restriction
) -> None:
    holds = (
        bool(restriction.principals and restriction.regions)
        and meta.tenant == restriction.tenant
        and meta.region in restriction.regions
        and bool(restriction.principals & set(meta.acl))
        and meta.effective_from <= restriction.as_of
        and (meta.effective_to is None or restriction.as_of <= meta.effective_to)
    )
    assert decide(restriction, meta).visible is holds is visible(restriction, meta)
