"""Supersession rules as a decision table."""

from __future__ import annotations

import datetime as dt

from gateway.domain import Document, Visibility, version_key, version_order
from gateway.ingest.versions import Closure, VersionSpan, apply_closures, plan_closures

D = dt.date


def doc(version: str, start: D, end: D | None = None, doc_id: str = "p") -> Document:
    return Document(
        doc_id, version, "t", "", "body", Visibility("t", "EU", ("group:a",), start, end)
    )


def key(version: str, doc_id: str = "p", tenant: str = "t") -> str:
    return version_key(tenant, doc_id, version)


def test_new_version_closes_open_previous_the_day_before() -> None:
    existing = [VersionSpan("t", "p", "1", D(2024, 1, 1), None)]
    closures = plan_closures(existing, [doc("2", D(2024, 6, 1))])
    assert closures == {key("1"): Closure(D(2024, 5, 31), "p@2")}


def test_explicit_end_dates_are_never_moved() -> None:
    existing = [VersionSpan("t", "p", "1", D(2024, 1, 1), D(2024, 12, 31))]
    assert plan_closures(existing, [doc("2", D(2024, 6, 1))]) == {}


def test_older_version_ingested_later_is_closed_by_the_newer_one() -> None:
    existing = [VersionSpan("t", "p", "2", D(2024, 6, 1), None)]
    closures = plan_closures(existing, [doc("1", D(2024, 1, 1))])
    assert closures == {key("1"): Closure(D(2024, 5, 31), "p@2")}
    assert apply_closures([doc("1", D(2024, 1, 1))], closures)[0].visibility.effective_to == D(
        2024, 5, 31
    )


def test_versions_in_one_batch_chain() -> None:
    batch = [doc("3", D(2024, 9, 1)), doc("1", D(2024, 1, 1)), doc("2", D(2024, 6, 1))]
    closures = plan_closures([], batch)
    assert closures == {
        key("1"): Closure(D(2024, 5, 31), "p@2"),
        key("2"): Closure(D(2024, 8, 31), "p@3"),
    }


def test_reingesting_same_version_replaces_not_closes() -> None:
    existing = [VersionSpan("t", "p", "1", D(2024, 1, 1), None)]
    assert plan_closures(existing, [doc("1", D(2024, 2, 1))]) == {}


def test_other_documents_are_untouched() -> None:
    existing = [VersionSpan("t", "q", "1", D(2024, 1, 1), None)]
    assert plan_closures(existing, [doc("2", D(2024, 6, 1))]) == {}


def test_another_tenants_version_of_the_same_id_is_another_document() -> None:
    """Tenant b's `p` version 2 neither closes nor replaces tenant t's `p` version 1."""
    existing = [VersionSpan("t", "p", "1", D(2024, 1, 1), None)]
    other = doc("2", D(2024, 6, 1))
    other = Document(
        other.doc_id, "2", "t", "", "body", Visibility("b", "EU", ("group:a",), D(2024, 6, 1), None)
    )
    assert plan_closures(existing, [other]) == {}
    same_version = Document(
        "p", "1", "t", "", "body", Visibility("b", "EU", ("group:a",), D(2024, 2, 1), None)
    )
    assert same_version.key != existing[0].key  # a re-ingest by b replaces nothing of t


def test_of_two_versions_starting_the_same_day_the_higher_is_in_force() -> None:
    """A correction issued the same day: both stayed open, and search and answers cited
    the corrected text beside the correction. Which was ingested first does not matter;
    versions compare as numbers where they are ("10" after "9")."""
    same_day = D(2024, 1, 1)
    never = Closure(D(2023, 12, 31), "p@2")  # closed the day before it starts
    assert plan_closures([VersionSpan("t", "p", "1", same_day, None)], [doc("2", same_day)]) == {
        key("1"): never
    }
    assert plan_closures([VersionSpan("t", "p", "2", same_day, None)], [doc("1", same_day)]) == {
        key("1"): never
    }
    batch = [doc("10", same_day), doc("9", same_day), doc("11", D(2024, 6, 1))]
    assert plan_closures([], batch) == {
        key("9"): Closure(D(2023, 12, 31), "p@10"),
        key("10"): Closure(D(2024, 5, 31), "p@11"),
    }


def test_versions_compare_as_numbers_where_they_are() -> None:
    ordered = ["1", "2", "9", "10", "v1.9", "v1.10", "v2", "² "]
    assert sorted(ordered, key=version_order) == ["1", "2", "9", "10", "v1.9", "v1.10", "v2", "² "]
    assert sorted(["01", "1"], key=version_order) == ["01", "1"]  # equal numbers: by text
