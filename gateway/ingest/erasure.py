"""Erasure: deleted versions' text, titles and vectors gone from every file and object.

A delete makes a version invisible at once, but its bytes stay: Tantivy only marks the
documents deleted, LanceDB keeps deleted rows in their fragments and older table versions,
older generations (local, published, vector copies under `flat/`) still hold it. Erasure
runs for every pending request together (`gateway/storage/erasures.py`), in two steps,
each under the writer lock:

1. **write** an erasure generation from the served one: the lexical partitions of each
   tenant with deletes written again from the catalog (nothing else changes in them), a
   fresh vector table with exactly the served rows (vectors copied, not embedded again);
   the requests are marked `written` in the transaction that commits it. First, queued
   jobs' slices that embedders handed over (`embed_slices`) lose the vectors of versions
   deleted from the jobs since (`EmbedSlices.scrub`): they would otherwise stay in the
   catalog until the job ends, perhaps past the erasure's deadline.
2. **retire**, once no replica serves an older generation: every older local generation
   and vector copy, every older published generation, every vector table only older
   generations name; SQLite's WAL is emptied (deleted rows were overwritten in place:
   `secure_delete`). The requests are marked `done` with the report.

With no generation yet (only queued jobs were deleted from), step 1 alone empties the WAL
and marks the requests `done`; a reader keeping it from being emptied leaves them pending.

Each step reads its state from the catalog, so a writer killed anywhere resumes: a
half-written generation is discarded as after a crashed ingest, and retiring again
removes what is left. Replicas remove their own older copies when they serve the erasure
generation (`gateway/storage/current.py`), also when they were down while it ran.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import text

from gateway.storage.catalog import Catalog, GenerationRow
from gateway.storage.erasures import PENDING, WRITTEN
from gateway.storage.layout import (
    DataLayout,
    copies_left,
    disk_usage,
    prune_lexical,
    remove_older_copies,
    snapshot_lexical,
)
from gateway.storage.names import generation_name, generation_number
from gateway.storage.partitions import LexicalIndex
from gateway.storage.vectors import (
    copy_table,
    drop_unused_tables,
    store_outage_is_not_ready,
    table_names,
)

log = logging.getLogger("gateway.erasure")
# What a run waits for when a reader kept the WAL file from being emptied.
WAL_HELD = "SQLite readers (the WAL file could not be emptied)"
KEPT = (
    "audit records (IDs only, by design) until the policy's audit.retention_days",
    "job records: IDs, counts and errors; their documents were dropped when each job ended",
    "generation records: numbers, table names and counts",
    "the operator's: database backups and WAL archives, object-store versions of the bucket",
)


@dataclass
class ErasureReport:
    requests: int = 0
    generation: int | None = None  # the erasure generation
    tenants_rewritten: int = 0
    slices_cleared: int = 0  # handed-over slices of queued jobs that held erased versions
    files_removed: int = 0  # local files (hard links of one file count once)
    bytes_removed: int = 0
    objects_removed: int = 0  # in the object store
    object_bytes_removed: int = 0
    tables_dropped: list[str] = field(default_factory=list)
    waiting_for: list[str] = field(default_factory=list)  # replicas serving older ones
    done: bool = False
    seconds: float = 0.0
    kept: tuple[str, ...] = KEPT

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def erase(layout: DataLayout, *, ann_min_rows: int, wait_s: float = 0.0) -> ErasureReport:
    """Erase every open request: write the erasure generation if a request is pending,
    wait up to `wait_s` for the replicas to serve it, then retire what is older. Not done
    (`waiting_for` names the replicas) when they still serve older ones: run it again."""
    started = time.perf_counter()
    catalog = layout.open_catalog()
    report = ErasureReport(requests=len(catalog.erasures.open()))
    if any(r.status == PENDING for r in catalog.erasures.open()):
        _write(layout, ann_min_rows, report)
    written = [r for r in catalog.erasures.open() if r.status == WRITTEN]
    if not written:  # nothing to retire: the pending ones `_write` saw are done by now
        # A request still pending came after `_write` looked (a delete committed while
        # another process erased everything): nothing was erased for it, so it stays
        # open for the next run, and this one is not done.
        report.done = not any(r.status == PENDING for r in catalog.erasures.open())
        report.seconds = time.perf_counter() - started
        return report
    generation = max(r.generation or 0 for r in written)
    report.generation = generation
    deadline = time.monotonic() + wait_s
    while behind := catalog.replicas.behind(generation):
        if time.monotonic() >= deadline:
            report.waiting_for = behind
            report.seconds = time.perf_counter() - started
            return report
        time.sleep(0.1)
    with layout.writer_lock():
        _retire(layout, catalog, generation, report)
    report.seconds = time.perf_counter() - started
    if left := copies_left(layout, generation):  # removal failed: the text is still there
        report.waiting_for = [f"{len(left)} old copies that could not be removed ({left[0]})"]
        return report
    if not _empty_wal(catalog):  # a reader held it throughout: the next run does it
        report.waiting_for = [WAL_HELD]
        return report
    report.done = True
    seqs = [r.seq or 0 for r in written if (r.generation or 0) <= generation]
    catalog.erasures.mark_done(seqs, report.as_dict())
    log.info(
        "erased through generation %d: %d files, %d objects removed",
        generation,
        report.files_removed,
        report.objects_removed,
    )
    return report


def _write(layout: DataLayout, ann_min_rows: int, report: ErasureReport) -> None:
    """Step 1: the erasure generation, for the requests pending under the lock; counts
    the tenants whose lexical partitions were written again and the handed-over slices
    cleared in `report`."""
    with layout.writer_lock() as lock:
        catalog = layout.open_catalog()
        seqs = [r.seq or 0 for r in catalog.erasures.open() if r.status == PENDING]
        current = catalog.current_generation()
        if not seqs:
            return  # another process wrote it meanwhile
        # After reading the requests: a delete drops the version from queued jobs in the
        # transaction that records its request, so each of `seqs` is seen here. SQLite
        # overwrites the cleared bytes (`secure_delete`); `erase` empties the WAL later.
        report.slices_cleared = catalog.slices.scrub()
        if current is None:  # nothing was ever written: only the catalog's WAL to empty
            # Always, not only when slices were cleared now: the delete itself (a queued
            # job's records, a tenant's rows) left the old pages in the WAL, and so may a
            # run before this one whose emptying failed.
            if not _empty_wal(catalog):  # a reader held it: the requests stay pending
                report.waiting_for = [WAL_HELD]
                return
            catalog.erasures.mark_done(seqs, ErasureReport(done=True).as_dict())
            return
        number = current.id + 1
        base = layout.local_lexical(current)
        with layout.lexical_build(number, lock) as build:
            snapshot_lexical(base, build)
            rebuilt = LexicalIndex(build).erase(catalog.tenants(), catalog.tenant_chunks)
            lexical_dir = layout.install_lexical(build, number, lock)
        with store_outage_is_not_ready():  # the store away: the erasure runs again
            table = f"chunks_{generation_name(number)}"
            indexed = copy_table(
                layout.vectors_uri,
                layout.vector_options,
                current.vector_table,
                current.vector_version,
                table,
                current.dim,
            )
            store = layout.open_vectors(current.dim, table=table)
            if indexed:
                store.ensure_ann_index(ann_min_rows)
            layout.build_vector_copy(number, table, store)  # replaces a crashed attempt's
        generation = GenerationRow(
            id=number,
            created_at=dt.datetime.now(dt.UTC),
            lexical_dir=str(lexical_dir.relative_to(layout.root)),
            vector_table=table,
            vector_version=store.version,
            model_name=current.model_name,
            dim=current.dim,
            precisions=current.precisions,  # the vectors that stay keep their numerics
            documents=0,
            chunks=0,
        )
        catalog.commit_generation(
            generation,
            documents=(),
            chunks=(),
            sentence_vectors={},
            revised={},
            within=lambda connection, n, _: catalog.erasures.mark_written(connection, seqs, n),
            lock=lock,
        )
        layout.mark_committed(number)
        prune_lexical(layout, number)
        report.tenants_rewritten = rebuilt


def _retire(layout: DataLayout, catalog: Catalog, generation: int, report: ErasureReport) -> None:
    """Step 2: everything only generations before `generation` use, gone."""
    files, size = remove_older_copies(layout, generation)
    report.files_removed += files
    report.bytes_removed += size
    if layout.store is not None:
        for name in layout.store.published("lexical"):
            number = generation_number(name)
            if number is not None and number < generation:
                objects, object_bytes = layout.store.usage(f"lexical/{name}")
                layout.store.remove(f"lexical/{name}")
                report.objects_removed += objects
                report.object_bytes_removed += object_bytes
    kept = {g.vector_table for g in catalog.generations_from(generation)}
    unused = [t for t in table_names(layout.vectors_uri, layout.vector_options) if t not in kept]
    for table in unused:
        if layout.store is not None:
            objects, object_bytes = layout.store.usage(f"vectors/{table}.lance")
            report.objects_removed += objects
            report.object_bytes_removed += object_bytes
        else:
            files, size = disk_usage([layout.vectors / f"{table}.lance"], set())
            report.files_removed += files
            report.bytes_removed += size
    report.tables_dropped = drop_unused_tables(layout.vectors_uri, layout.vector_options, kept)


def _empty_wal(catalog: Catalog, tries: int = 50) -> bool:
    """SQLite: the WAL file may still hold pages as they were before the deletes; a
    truncating checkpoint copies the current pages into the database and empties it. A
    reader in the middle of a transaction blocks it: tried for a few seconds. Whether the
    WAL is empty (always, on a database server)."""
    if catalog.engine.dialect.name != "sqlite":
        return True
    for _ in range(tries):
        with catalog.engine.connect() as connection:
            busy = connection.execute(text("PRAGMA wal_checkpoint(TRUNCATE)")).scalar()
        if not busy:
            return True
        time.sleep(0.1)
    return False
