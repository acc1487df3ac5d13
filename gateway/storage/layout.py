"""Index generations on disk: where each part lives, cheap snapshots, and the served pair.

A generation is (a Tantivy directory, a LanceDB table version), recorded in the catalog.
A new generation's Tantivy directory starts as hard links to the previous one: Tantivy
never rewrites a file in place (segments are immutable, meta.json is replaced by rename),
so the old generation stays byte-for-byte intact while the new one is written, in a
directory of its writer's own that is renamed into place once the writer has checked that
it may (`DataLayout.install_lexical`). With an object store (`gateway/storage/objects.py`),
the LanceDB table lives there and each Tantivy generation is published there by its
writer and copied locally by each reader.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import func
from sqlmodel import select

from gateway.errors import GatewayError
from gateway.storage.catalog import Catalog, GenerationRow, generation_taken, open_engine
from gateway.storage.lease import GenerationLock, exclusive
from gateway.storage.names import generation_name, generation_number
from gateway.storage.objects import PUBLISHED, ObjectStore, abandoned_fetch
from gateway.storage.partitions import LexicalIndex
from gateway.storage.vectors import VectorStore, drop_unused_tables, store_outage_is_not_ready

if TYPE_CHECKING:
    from gateway.settings import Settings
    from gateway.storage.flat import FlatVectors

log = logging.getLogger("gateway.storage")
KEEP_GENERATIONS = 3  # the served one, and older ones a running server may still be reading
_LOCK_FILES = {".tantivy-writer.lock", ".tantivy-meta.lock"}
_REMOVING = ".removing-"  # `.g12.removing-<pid>`: a generation being deleted
_BUILDING = ".build-"  # `.build-g000012-<hex>`: a writer's generation until it is in place


@dataclass(frozen=True)
class DataLayout:
    root: Path
    database_url: str = ""  # the catalog's database; empty: catalog.db in the data dir
    store: ObjectStore | None = None  # where the index lives; None: in the data dir

    @property
    def catalog(self) -> Path:
        return self.root / "catalog.db"

    @property
    def vectors(self) -> Path:
        return self.root / "vectors"

    @classmethod
    def configured(cls, settings: Settings) -> DataLayout:
        """The data dir, catalog database and index store that `settings` name."""
        store = None
        if settings.index_uri:
            store = ObjectStore.from_uri(
                settings.index_uri,
                endpoint=settings.aws_endpoint_url,
                access_key=settings.aws_access_key_id,
                secret_key=settings.aws_secret_access_key.get_secret_value(),
                region=settings.aws_region,
                allow_http=settings.aws_allow_http,
            )
        return cls(settings.data_dir, settings.database_url, store)

    @property
    def vectors_uri(self) -> str:
        return self.store.vectors_uri if self.store else str(self.vectors)

    @property
    def vector_options(self) -> dict[str, str] | None:
        return self.store.lance_options if self.store else None

    def open_vectors(
        self, dim: int, version: int | None = None, table: str | None = None
    ) -> VectorStore:
        return VectorStore(
            self.vectors_uri, dim, version=version, table=table, options=self.vector_options
        )

    def flat_key(self, table: str, version: int) -> dict[str, Any]:
        """What names a table version's in-memory copy (`gateway.storage.flatfile`). The
        data dir's own vectors are named relative to it, as the copies are kept in it: a
        data dir moved, copied or restored from a backup maps the copies it holds instead
        of reading every vector again (and opening LanceDB) at its server's start."""
        where = self.store.vectors_uri if self.store else "data-dir:vectors"
        return {"vectors": where, "vector_table": table, "vector_version": version}

    def build_vector_copy(self, number: int, table: str, store: VectorStore) -> None:
        """For a writer, before generation `number` commits on `store`'s version: its
        in-memory copy, built now so that a server sharing this data dir maps it at the
        next request instead of reading the table then (and never opens LanceDB). Only
        where the index lives in the data dir: with an object store each host has its own
        data dir, and its servers build their own."""
        if self.store is None:
            key = self.flat_key(table, store.version)
            from gateway.storage.flatfile import build_flat  # numpy: not for `gateway keys list`

            build_flat(self.flat_root, number, key, store.snapshot)

    def local_lexical(self, generation: GenerationRow) -> Path:
        """The generation's Tantivy directory on local disk, copied from the object store
        first when there is one and the copy is not here yet. Without a store, a directory
        missing from the data dir (a partial restore, a deletion by hand) is `index_invalid`:
        opened as it is, every search would find nothing and say so with a 200, and the
        writer's next generation would be built on nothing."""
        local = self.root / generation.lexical_dir
        if self.store is not None and local.is_dir() and not (local / PUBLISHED).is_file():
            # Built here and never committed here: this host's writer stopped before its
            # commit, and another host's writer then committed a generation of the same
            # number (the lease moved). Served, it would show what that commit changed
            # (an ACL revoked) and what this one never committed. Fetched instead.
            remove_generation(local)
        if local.is_dir():
            return local
        if self.store is None:
            raise GatewayError(
                "index_invalid",
                f"index generation {generation.id}'s lexical index ({generation.lexical_dir}) "
                f"is missing from the data dir {self.root}. Restore the data dir whole, or "
                "run `gateway reindex` to build every document's index again.",
            )
        local.parent.mkdir(parents=True, exist_ok=True)
        older = [self.lexical(n) for n in range(generation.id - 1, 0, -1)][:KEEP_GENERATIONS]
        reuse = next((d for d in older if d.exists()), None)
        self.store.fetch(generation.lexical_dir, local, reuse)
        return local

    @contextmanager
    def lexical_build(self, number: int, lock: GenerationLock | None = None) -> Iterator[Path]:
        """A directory of the writer's own to build generation `number`'s Tantivy index in,
        then put in place by `install_lexical`; removed if the build fails. No reader nor
        other writer looks into it (`generation_number` gives its name no number), and a
        writer never writes into `lexical/g<N>`: another writer may have committed that
        generation meanwhile, on a data dir both share."""
        build = self.lexical_root / f"{_BUILDING}{generation_name(number)}-{uuid.uuid4().hex}"
        try:
            yield build
        except Exception as exc:
            if lock is not None and not isinstance(exc, GatewayError):
                # The writer that took the lock over removes this one's build
                # (`prune_lexical`), and the build fails on what is gone: say why.
                check_may_write(lock, number)
            raise
        finally:
            shutil.rmtree(build, ignore_errors=True)  # once put in place, gone already

    def install_lexical(self, build: Path, number: int, lock: GenerationLock | None = None) -> Path:
        """Put the writer's finished `build` in place as generation `number`'s directory, and
        publish it to the object store (if any), before the catalog commit that makes it
        current; its directory. With `lock` (the generation lock on PostgreSQL), only while
        it is still held and no generation `number` is committed: a writer that lost the
        lock would replace the files of the generation another writer committed."""
        if lock is not None:
            check_may_write(lock, number)
        target = self.lexical(number)
        if target.is_dir():  # a crashed writer's, not committed: checked, or SQLite's file lock
            remove_generation(target)
        build.rename(target)
        if self.store is not None:
            key = str(target.relative_to(self.root))
            self.store.remove(key)  # a crashed writer's part
            self.store.publish(target, key)
        return target

    def mark_committed(self, number: int) -> None:
        """After the catalog commit that names generation `number`: with an object store,
        the local build is now that generation's copy (`local_lexical`). A crash before
        this costs a fetch, never a wrong copy."""
        if self.store is not None:
            with contextlib.suppress(FileNotFoundError):  # replaced meanwhile: fetched
                (self.lexical(number) / PUBLISHED).write_text("committed\n")

    def prune_published(self, current: int, oldest_served: int | None) -> None:
        """Remove from the object store generations no replica serves, keeping the last
        few (a replica may be opening one)."""
        if self.store is None:
            return
        keep_from = min(current - KEEP_GENERATIONS + 1, oldest_served or current)
        for name in self.store.published("lexical"):
            number = generation_number(name)
            if number is not None and (number < keep_from or number > current):
                self.store.remove(f"lexical/{name}")

    def optimize_vectors(self, catalog: Catalog, number: int, store: VectorStore) -> int:
        """Before generation `number` commits on `store`: compact the table's small
        fragments and free what only generations no one may serve any more use (LanceDB
        versions before the oldest kept generation's: the last few, and any a replica
        serves; chunk tables of an earlier `reindex` no kept generation names). Returns
        the version the generation pins."""
        oldest_served = catalog.replicas.oldest_served() or number
        kept = catalog.generations_from(min(number - KEEP_GENERATIONS + 1, oldest_served))
        pinned = [g.vector_version for g in kept if g.vector_table == store.table]
        version = store.optimize(keep_from=min(pinned, default=store.version))
        drop_unused_tables(
            self.vectors_uri, self.vector_options, {store.table, *(g.vector_table for g in kept)}
        )
        return version

    @property
    def flat_root(self) -> Path:
        return self.root / "flat"

    @property
    def lexical_root(self) -> Path:
        return self.root / "lexical"

    def lexical(self, generation: int) -> Path:
        return self.lexical_root / generation_name(generation)

    @property
    def catalog_url(self) -> str:
        return self.database_url or f"sqlite:///{self.catalog.resolve()}"

    def open_catalog(self) -> Catalog:
        self.root.mkdir(parents=True, exist_ok=True)
        return Catalog(self.catalog_url)

    @contextmanager
    def writer_lock(self) -> Iterator[GenerationLock | None]:
        """One writer of generations at a time; readers never take it. With a catalog on
        a database server, writers on every host share it (an advisory lock, which can be
        lost: what it yields is handed to `install_lexical` and `commit_generation`); with
        SQLite, named by a `sqlite:///` URL or not, it is a file lock in the data dir, held
        as long as the process lives (None)."""
        if not self.catalog_url.startswith("sqlite"):
            with exclusive(open_engine(self.catalog_url)) as lock:
                yield lock
            return
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".ingest.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield None
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def check_may_write(lock: GenerationLock, number: int) -> None:
    """Raise unless the writer may still put generation `number` in place: its session
    still holds the generation lock, and no generation `number` or later is committed
    (one by a writer that does not check the lock: an older release during an upgrade)."""
    with lock.connection.begin():  # ended at once: the session idles again
        lock.check(number)
        newest = lock.connection.execute(select(func.max(GenerationRow.id))).scalar()
    if newest is not None and newest >= number:
        raise generation_taken(number)


def snapshot_lexical(source: Path | None, target: Path) -> None:
    """Start `target` as a hard-linked copy of `source` (or empty), tenant partitions
    included: a partition the new generation does not touch costs no copy at all."""
    target.mkdir(parents=True)  # refuses one that exists: it may be another's generation
    if source is None:
        return
    for entry in source.iterdir():
        if entry.is_dir():
            snapshot_lexical(entry, target / entry.name)
        elif entry.is_file() and entry.name not in _LOCK_FILES and entry.name != PUBLISHED:
            os.link(entry, target / entry.name)


def prune_lexical(layout: DataLayout, current: int, unfinished: bool = True) -> None:
    """Remove local generations older than the last few, and (for the writer, under the
    generation lock) unfinished ones above current and the builds of writers that crashed
    (`DataLayout.lexical_build`). A writer still building now has lost the lock: its build
    could never be put in place, and it fails saying so."""
    if not layout.lexical_root.exists():
        return
    for entry in layout.lexical_root.iterdir():
        if unfinished and entry.name.startswith(_BUILDING):
            shutil.rmtree(entry, ignore_errors=True)  # never read: no need to rename it first
            continue
        number = generation_number(entry.name)
        if number is None:
            continue
        if number <= current - KEEP_GENERATIONS or (unfinished and number > current):
            remove_generation(entry)
    _finish_removals(layout.lexical_root)


def remove_generation(directory: Path) -> None:
    """Remove a generation's directory at once, as far as its readers can see: renamed
    away first, then deleted. Deleted in place, its partitions would vanish one by one
    under a generation still there, and a search that had not yet opened its tenant's
    would take the missing directory for a tenant without documents and answer nothing;
    gone whole, the search knows its generation was removed (`GenerationRemoved`)."""
    doomed = directory.with_name(f".{directory.name}{_REMOVING}{os.getpid()}-{uuid.uuid4().hex}")
    try:
        directory.rename(doomed)
    except FileNotFoundError:
        return  # removed meanwhile by another process of the host
    except OSError as exc:  # e.g. no right to rename here: removed in place, as before
        log.warning("generation %s not renamed before removal (%s)", directory.name, exc.errno)
        doomed = directory
    shutil.rmtree(doomed, ignore_errors=True)


def _finish_removals(root: Path) -> None:
    """Delete what a process cut short left (`_left_over`)."""
    for entry in _left_over(root):
        shutil.rmtree(entry, ignore_errors=True)


def _left_over(root: Path) -> list[Path]:
    """What a killed process left under `root`: a removal cut short between the rename
    and the end, and the staging directory of a replica's fetch (`abandoned_fetch`). Both
    may hold text an erasure must not leave behind."""
    return [
        entry
        for entry in root.iterdir()
        if (entry.name.startswith(".") and _REMOVING in entry.name) or abandoned_fetch(entry)
    ]


def remove_older_copies(layout: DataLayout, generation: int) -> tuple[int, int]:
    """Remove this data dir's lexical generations and vector copies older than
    `generation` (an erasure generation this process serves or newer), and what a
    removal cut short left: (files, bytes) freed, a file hard-linked from a kept
    generation not counted."""
    older, newer, cut_short = _copies(layout, generation)
    kept = {stat.inode for stat in _stats(files_under(newer))}
    files, size = disk_usage([*cut_short, *older], kept)
    for entry in cut_short:
        shutil.rmtree(entry, ignore_errors=True)
    for entry in older:
        remove_generation(entry)
    return files, size


def copies_left(layout: DataLayout, generation: int) -> list[Path]:
    """What `remove_older_copies(layout, generation)` should have removed and is still
    there: a removal that failed (no right to delete, a busy mount) leaves text an erasure
    must not call erased."""
    older, _newer, cut_short = _copies(layout, generation)
    return [*cut_short, *older]


def _copies(layout: DataLayout, generation: int) -> tuple[list[Path], list[Path], list[Path]]:
    """This data dir's lexical generations and vector copies (a copy being written too:
    `.partial`) older than `generation`, the others, and what a removal cut short left."""
    older: list[Path] = []
    newer: list[Path] = []
    cut_short: list[Path] = []
    for root in (layout.lexical_root, layout.flat_root):
        if not root.exists():
            continue
        cut_short += _left_over(root)
        for entry in root.iterdir():
            number = generation_number(entry.name, partial=True)
            if number is not None:
                (older if number < generation else newer).append(entry)
    return older, newer, cut_short


def remove_erased_copies(
    layout: DataLayout, catalog: Catalog, newest: int, erased_through: int
) -> int:
    """Once `newest` (the generation a process serves, or the writer's current one) is an
    erasure generation or newer, this data dir keeps no older generation nor vector copy:
    they hold erased versions. A process that was down when the erasure ran, or whose data
    dir is not the one `gateway erase` ran on (a replica, a writer on another host), does
    it at its next look. Not while a replica still serves an older one: it may share this
    data dir. Returns how far the data dir is erased now (`erased_through` when nothing
    was to do, or it must wait)."""
    barrier = catalog.erasures.barrier(newest)
    if barrier is None or barrier <= erased_through or catalog.replicas.behind(barrier):
        return erased_through
    files, size = remove_older_copies(layout, barrier)
    if left := copies_left(layout, barrier):
        log.warning("%d old copies could not be removed (%s); retrying", len(left), left[0].name)
        return erased_through
    if files:
        log.info("erased %d local files (%d bytes) before generation %d", files, size, barrier)
    return barrier


def files_under(roots: Iterable[Path]) -> Iterable[Path]:
    """Every file under `roots`, at any depth."""
    for root in roots:
        for directory, _, names in os.walk(root):
            for name in names:
                yield Path(directory) / name


class _Stat(NamedTuple):
    inode: tuple[int, int]
    size: int


def _stats(paths: Iterable[Path]) -> Iterable[_Stat]:
    """Each file's inode and size, skipping one gone since it was listed: a serving
    process and `gateway erase` may free the same old copies at the same time."""
    for path in paths:
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        yield _Stat((stat.st_dev, stat.st_ino), stat.st_size)


def disk_usage(roots: Iterable[Path], kept: set[tuple[int, int]]) -> tuple[int, int]:
    seen: set[tuple[int, int]] = set()
    size = 0
    for stat in _stats(files_under(roots)):
        if stat.inode in kept or stat.inode in seen:
            continue
        seen.add(stat.inode)
        size += stat.size
    return len(seen), size


@dataclass(frozen=True)
class ServedIndex:
    """Both lanes' view of one generation: whatever a request reads comes from here."""

    generation: GenerationRow
    lexical: LexicalIndex
    vectors: VectorStore
    flat: FlatVectors  # the same rows as `vectors`, in memory for exact search

    @property
    def number(self) -> int:
        return self.generation.id

    @property
    def acl_principals(self) -> frozenset[str]:
        """Principals some chunk's ACL names in this generation."""
        return self.flat.principals


def open_served(
    layout: DataLayout,
    catalog: Catalog,
    model_name: str,
    dim: int,
    previous: ServedIndex | None = None,
    table_above: int | None = None,
) -> ServedIndex | None:
    """The catalog's current generation, or None before the first ingest. Its vector copy
    is mapped from the data dir when a process has built it, else built (from the
    `previous` served generation's copy where that saves reading vectors) and kept there.
    The LanceDB table is opened only when the copy holds more than `table_above` rows: a
    universe that large may be searched by the ANN index (`flat_search_max_rows`), and
    the table then opens here rather than inside a query's dense lane and its budget."""
    generation = catalog.current_generation()
    if generation is None:
        return None
    check_model(generation, model_name, dim)
    try:
        lexical_dir = layout.local_lexical(generation)
    except GatewayError as exc:
        if exc.code == "index_invalid" and catalog.current_generation_id() != generation.id:
            # Removed because a newer one was committed meanwhile: nothing is wrong
            # with either, and the next look opens the newer one.
            raise GatewayError("not_ready", f"index generation {generation.id} was replaced "
                               "while it was opened; retry") from None  # fmt: skip
        raise
    lexical = LexicalIndex(lexical_dir, create=False)
    vectors = layout.open_vectors(
        generation.dim, version=generation.vector_version, table=generation.vector_table
    )
    key = layout.flat_key(generation.vector_table, generation.vector_version)
    base = None
    if previous is not None and previous.generation.vector_table == generation.vector_table:
        base = previous.flat
    from gateway.storage.flatfile import open_flat

    with store_outage_is_not_ready():
        flat = open_flat(layout.flat_root, generation.id, key, vectors.snapshot, base)
        if table_above is not None and flat.size > table_above:
            _ = vectors.has_ann_index  # opens the table and asks it once, here
    return ServedIndex(generation, lexical, vectors, flat)


def check_model(generation: GenerationRow, model_name: str, dim: int) -> None:
    """The embedding model is part of the index: refuse to mix vectors of two models."""
    if generation.model_name != model_name or generation.dim != dim:
        raise GatewayError(
            "index_mismatch",
            f"index generation {generation.id} was built with {generation.model_name} "
            f"(dim {generation.dim}); the configured model is {model_name} (dim {dim}). "
            "Run `gateway reindex` to embed every document again with the configured model.",
        )
