"""LanceDB keeps every version of a table until told: every OPTIMIZE_EVERY generations the
writer compacts the table and frees what only generations no one may serve any more use,
never what a kept generation or a replica still reads."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import lancedb
import pytest

from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths, reindex, set_acl
from gateway.ingest.writer import OPTIMIZE_EVERY
from gateway.storage.catalog import Catalog
from gateway.storage.layout import KEEP_GENERATIONS, DataLayout, open_served
from gateway.storage.vectors import PRUNE_MARGIN
from tests.helpers.documents import RISK, STAFF, STAFF_EU, write_doc

pytestmark = pytest.mark.server

META = {**STAFF_EU, "effective_from": "2020-01-01"}


def versions(layout: DataLayout, table: str) -> list[int]:
    db = lancedb.connect(str(layout.vectors))
    return sorted(int(v["version"]) for v in db.open_table(table).list_versions())


def wait_past_prune_margin(layout: DataLayout, table: str) -> None:
    """LanceDB deletes by age: a version goes once it is PRUNE_MARGIN older than a kept one.
    Waits until the clock is that far past the table's newest version, so that every version
    written after this is a margin newer than the ones before it."""
    db = lancedb.connect(str(layout.vectors))
    newest = max(v["timestamp"] for v in db.open_table(table).list_versions())
    while dt.datetime.now(newest.tzinfo) - newest <= PRUNE_MARGIN:
        time.sleep(0.05)


def flip_until(layout: DataLayout, catalog: Catalog, generation: int) -> None:
    """ACL changes, one generation each, until `generation` is current."""
    while (catalog.current_generation_id() or 0) < generation:
        if set_acl(layout, "acme", "a", ["group:risk"]) is None:  # risk's already
            set_acl(layout, "acme", "a", ["group:staff"])


def test_old_versions_and_tables_go_once_no_kept_generation_pins_them(
    tmp_path: Path, embedder: Embedder
) -> None:
    docs, layout = tmp_path / "docs", DataLayout(tmp_path / "data")
    write_doc(docs, "a.md", {"doc_id": "a", **META}, "Rule AAA-1 applies.")
    write_doc(docs, "b.md", {"doc_id": "b", **META}, "Rule BBB-2 applies.")
    ingest_paths([docs], layout, embedder)
    catalog = layout.open_catalog()
    table = catalog.generations_from(1)[0].vector_table
    flip_until(layout, catalog, 2)
    wait_past_prune_margin(layout, table)
    flip_until(layout, catalog, OPTIMIZE_EVERY - 1)
    # A replica serves generation 3, seen just before the write that cleans up (a report
    # older than FRESH_S counts as a replica gone, and a loaded machine takes seconds to
    # write the generations in between).
    catalog.replicas.report(3)
    flip_until(layout, catalog, OPTIMIZE_EVERY)
    generation_2, generation_3 = catalog.generations_from(2)[:2]
    assert generation_2.vector_version < min(versions(layout, table))
    assert min(versions(layout, table)) <= generation_3.vector_version  # what it reads stays
    index = open_served(layout, catalog, embedder.name, embedder.dim)
    assert index is not None
    old = layout.open_vectors(embedder.dim, generation_3.vector_version, table)
    assert old.count() == 2  # the replica's generation still reads whole

    catalog.replicas.leave()  # the replica is gone: only the last few generations stay
    first_kept = 2 * OPTIMIZE_EVERY - KEEP_GENERATIONS + 1
    flip_until(layout, catalog, first_kept - 1)
    wait_past_prune_margin(layout, table)
    flip_until(layout, catalog, 2 * OPTIMIZE_EVERY)
    before, *kept = catalog.generations_from(first_kept - 1)
    assert before.vector_version < min(versions(layout, table)) <= kept[0].vector_version
    for generation in kept:
        assert layout.open_vectors(embedder.dim, generation.vector_version, table).count() == 2
    after = open_served(layout, catalog, embedder.name, embedder.dim, index)  # compacted rows
    assert after is not None
    for restriction in (STAFF, RISK):
        assert after.vectors.filter_only(restriction) == {
            after.flat.chunk_id(r) for r in after.flat.permitted_rows(restriction)
        }

    reindex(layout, embedder)  # a new table; the old one goes when no kept generation names it
    flip_until(layout, catalog, 3 * OPTIMIZE_EVERY)
    current = catalog.current_generation()
    assert current is not None and current.vector_table != table
    assert lancedb.connect(str(layout.vectors)).list_tables().tables == [current.vector_table]
