"""The LanceDB chunk table: vectors plus visibility columns. The only module importing lancedb.

Every search is prefiltered with the restriction's SQL (`to_sql_where`), so the engine
ranks only chunks the caller may see. Readers pin a table version: the version recorded for
the served generation, so a half-written ingest is never read.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from gateway.domain import Chunk, Visibility, version_key
from gateway.restriction import Restriction, day_number
from gateway.storage.objects import STORE_REFUSES, store_refuses, store_unreachable

DEFAULT_TABLE = "chunks"
SNAPSHOT_BATCH = 65536  # rows per batch streamed into the in-memory copy
# LanceDB's row address (fragment << 32 | offset): data files are never rewritten, so an
# address names the same stored row in every version of the table.
ADDRESS = "_rowaddr"
KEEP_ALL = dt.timedelta(days=36500)  # an age no version reaches
PRUNE_MARGIN = dt.timedelta(seconds=1)  # versions this close before a kept one stay too


@dataclass(frozen=True)
class Snapshot:
    """One pinned table version: `rows` rows of `dim`-wide vectors; `read(columns)`
    streams those columns (ADDRESS among them) in batches; `read_from(address, columns)`
    only the rows at or past an address."""

    rows: int
    dim: int
    read: Callable[[Sequence[str]], Iterable[pa.RecordBatch]]
    read_from: Callable[[int, Sequence[str]], Iterable[pa.RecordBatch]] | None = None


def _schema(dim: int) -> pa.Schema:
    return pa.schema(
        [
            ("chunk_id", pa.string()),
            ("doc_key", pa.string()),
            ("tenant", pa.string()),
            ("region", pa.string()),
            ("acl", pa.list_(pa.string())),
            ("effective_from", pa.int32()),
            ("effective_to", pa.int32()),
            ("vector", pa.list_(pa.float32(), dim)),
        ]
    )


class VectorHit(NamedTuple):  # a tuple: hundreds are made per query, each at tuple cost
    chunk_id: str
    distance: float


class VectorStore:
    """The chunk table of one data dir; `version` pins what readers see."""

    def __init__(
        self,
        path: Path | str,
        dim: int,
        version: int | None = None,
        table: str | None = DEFAULT_TABLE,
        options: dict[str, str] | None = None,
    ) -> None:
        self.dim = dim
        self.table = table or DEFAULT_TABLE
        self._uri, self._options, self._version = str(path), options, version
        self._opened: Any = None
        self._opening = threading.Lock()

    @property
    def _table(self) -> Any:
        """The table, opened on first use. A server whose generation's in-memory copy is
        already in the data dir answers without it, and importing lancedb alone costs a
        process about a second of CPU."""
        if self._opened is None:
            with self._opening:
                if self._opened is None:
                    self._opened = self._open()
        return self._opened

    def _open(self) -> Any:
        # `_uri` is a directory, or an s3:// URI with its storage options.
        db = _connect(self._uri, self._options)
        if self.table in db.list_tables().tables:
            table = db.open_table(self.table)
        else:
            table = db.create_table(self.table, schema=_schema(self.dim))
        if self._version is not None:
            table.checkout(self._version)
        return table

    @property
    def version(self) -> int:
        return int(self._table.version)

    # -- writes -------------------------------------------------------------------------

    def reset_to(self, version: int) -> None:
        """Drop anything written after `version` (a crashed ingest) before writing anew."""
        if self._table.version != version:
            self._table.checkout(version)
            self._table.restore()

    def apply(
        self,
        delete_doc_keys: Iterable[str],
        add: Sequence[Chunk],
        vectors: np.ndarray,
        revise: Mapping[str, Visibility],
    ) -> int:
        """Delete versions, give others new visibility (same vectors), add chunks; returns
        the new table version."""
        keys = sorted(set(delete_doc_keys))
        for start in range(0, len(keys), 500):
            batch = ", ".join(sql_string(k) for k in keys[start : start + 500])
            self._table.delete(f"doc_key IN ({batch})")
        for key, v in revise.items():
            self._table.update(
                where=f"doc_key = {sql_string(key)}",
                values={
                    "tenant": v.tenant,
                    "region": v.region,
                    "acl": list(v.acl),
                    "effective_from": day_number(v.effective_from),
                    "effective_to": day_number(v.effective_to),
                },
            )
        if add:
            self._table.add(_to_arrow(add, vectors, self.dim))
        return self.version

    def optimize(self, keep_from: int) -> int:
        """Compact small fragments (every push adds one) and delete the files only versions
        before `keep_from` use; returns the new version. Versions from `keep_from` on stay
        readable. Compaction moves rows, so the next vector copy reads those again."""
        self._table.optimize(cleanup_older_than=KEEP_ALL)  # compaction, no deletion yet
        self.__dict__.pop("has_ann_index", None)
        stamps = {int(v["version"]): v["timestamp"] for v in self._table.list_versions()}
        if keep_from in stamps:
            kept_from = stamps[keep_from]
            if kept_from.tzinfo is None:
                kept_from = kept_from.astimezone()  # LanceDB reports local time
            # LanceDB deletes what is older than its own clock minus the age given, read
            # a moment later than ours: the margin keeps `keep_from` whatever that moment.
            age = dt.datetime.now(kept_from.tzinfo) - kept_from + PRUNE_MARGIN
            self._table.optimize(cleanup_older_than=age)  # compacts nothing new
        return self.version

    # -- reads --------------------------------------------------------------------------

    def ensure_ann_index(self, min_rows: int) -> bool:
        """An IVF-PQ index on the vectors once the table has `min_rows`; True if one exists.
        LanceDB searches rows added after it exhaustively, so it needs no rebuild per add."""
        if self.count() < min_rows:
            return False
        if self.has_ann_index:
            return True
        from lancedb.index import IvfPq

        config = IvfPq(
            distance_type="cosine",
            num_partitions=max(16, int(self.count() ** 0.5)),
            num_sub_vectors=max(1, self.dim // 8),
        )
        self._table.create_index("vector", config=config)
        self.__dict__.pop("has_ann_index", None)  # the table has moved on to a new version
        return True

    @functools.cached_property
    def has_ann_index(self) -> bool:
        """Whether the pinned table version has an IVF index (asked once per reader)."""
        return any(i.index_type.upper().startswith("IVF") for i in self._table.list_indices())

    def search(
        self,
        restriction: Restriction,
        vector: np.ndarray,
        limit: int,
        nprobes: int = 64,
        refine_factor: int = 20,
        exact: bool = False,
    ) -> list[VectorHit]:
        """Cosine top `limit` under the restriction (a prefilter: only permitted rows are
        scored). With an ANN index, `nprobes` partitions are searched and `refine_factor`
        times `limit` candidates re-scored exactly; without one, or with `exact`, every
        permitted row is scored."""
        if restriction.is_empty:
            return []
        query: Any = self._table.search(vector.astype(np.float32), vector_column_name="vector")
        query = query.distance_type("cosine")
        if exact:
            query = query.bypass_vector_index()
        else:
            query = query.nprobes(nprobes).refine_factor(refine_factor)
        rows = (
            query.where(to_sql_where(restriction), prefilter=True)
            .select(["chunk_id", "_distance"])
            .limit(limit)
            .to_arrow()
        )
        ids = rows.column("chunk_id").to_pylist()
        distances = rows.column("_distance").to_pylist()
        return [VectorHit(str(c), float(d)) for c, d in zip(ids, distances, strict=True)]

    def filter_only(self, restriction: Restriction) -> set[str]:
        """Every chunk ID the restriction admits (used to test the filter)."""
        if restriction.is_empty:
            return set()
        rows = (
            self._table.search()
            .where(to_sql_where(restriction))
            .select(["chunk_id"])
            .limit(max(1, self.count()))
            .to_arrow()
        )
        return {str(c) for c in rows.column("chunk_id").to_pylist()}

    def count(self) -> int:
        return int(self._table.count_rows())

    def snapshot(self) -> Snapshot:
        """The pinned version's rows, for the in-memory copy."""
        table = self._table

        def read(columns: Sequence[str]) -> Iterable[pa.RecordBatch]:
            query = table.search().select(list(columns)).limit(None)
            return query.to_batches(SNAPSHOT_BATCH)  # type: ignore[no-any-return]

        def read_from(address: int, columns: Sequence[str]) -> Iterable[pa.RecordBatch]:
            query = table.search().where(f"{ADDRESS} >= {int(address)}").select(list(columns))
            return query.limit(None).to_batches(SNAPSHOT_BATCH)  # type: ignore[no-any-return]

        return Snapshot(self.count(), self.dim, read, read_from)


# How LanceDB reports an object store it cannot reach (object_store's S3 client inside):
# a ValueError reading "... IO { source: Generic { store: \"S3\", ... RetryError ...".
_STORE_AWAY = re.compile(r'store: "S3"|RetryError|Failed to connect')
# What the store answers until its configuration is fixed: by the S3 error code of its
# reply, which LanceDB's message quotes ("... <Code>NoSuchBucket</Code>").
_REFUSAL_CODE = re.compile("<Code>(" + "|".join(STORE_REFUSES) + ")</Code>")


@contextmanager
def store_outage_is_not_ready() -> Iterator[None]:
    """An object store LanceDB cannot reach is 503 `not_ready` (transient), as pyarrow's
    is for the Tantivy files (gateway/storage/objects.py): as a ValueError it failed an
    ingest job as its own fault, its documents dropped, and answered a request 500. A store
    that answers but refuses the configured bucket or key is `not_ready` too, but says so,
    naming the setting to fix, not "cannot be reached": the operator's fix (or an access
    policy that takes a moment to apply) is waited for, and no job is failed, its documents
    dropped, for it. The type and the store's error code only in the detail: the message
    names the endpoint and the keys."""
    try:
        yield
    except (ValueError, OSError, RuntimeError) as exc:
        message = str(exc)
        if not _STORE_AWAY.search(message):
            raise
        if refused := _REFUSAL_CODE.search(message):
            raise store_refuses(refused.group(1)) from None
        raise store_unreachable(exc) from None


def _connect(uri: str, options: dict[str, str] | None) -> Any:
    import lancedb  # here, not at the top: see VectorStore._table

    return lancedb.connect(uri, storage_options=options)


def drop_unused_tables(uri: str, options: dict[str, str] | None, used: set[str]) -> list[str]:
    """Drop the chunk tables (`chunks`, and `chunks_gNNNNNN` of each reindex) that `used`
    does not name; returns their names."""
    db = _connect(uri, options)
    dropped = [
        table
        for table in db.list_tables().tables
        if table not in used and (table == DEFAULT_TABLE or table.startswith("chunks_g"))
    ]
    gone = []
    for table in dropped:
        try:
            db.drop_table(table)
            gone.append(table)
        except (ValueError, FileNotFoundError):
            # An object store may keep listing a dropped table's directory after its
            # objects are gone: nothing is left to drop.
            continue
    return gone


def copy_table(
    uri: str, options: dict[str, str] | None, source: str, version: int, target: str, dim: int
) -> bool:
    """Write table `target` afresh with exactly the rows `source` has at `version`, vectors
    copied, never embedded again (an erasure's table: LanceDB only marks a deleted row,
    and its compaction leaves a fragment with few deletes as it is); whether `source` had
    an ANN index. A `target` left by a crashed erasure is replaced."""
    db = _connect(uri, options)
    if target in db.list_tables().tables:
        db.drop_table(target)
    table = db.open_table(source)
    table.checkout(version)
    schema = _schema(dim)
    indexed = any(i.index_type.upper().startswith("IVF") for i in table.list_indices())
    batches = table.search().select(schema.names).limit(None).to_batches(SNAPSHOT_BATCH)
    copied = (
        pa.RecordBatch.from_arrays([b.column(n) for n in schema.names], schema=schema)
        for b in batches
        if b.num_rows
    )
    db.create_table(target, data=pa.RecordBatchReader.from_batches(schema, copied), schema=schema)
    return indexed


def table_names(uri: str, options: dict[str, str] | None) -> list[str]:
    return list(_connect(uri, options).list_tables().tables)


def _to_arrow(chunks: Sequence[Chunk], vectors: np.ndarray, dim: int) -> pa.Table:
    if vectors.shape != (len(chunks), dim):
        raise ValueError(f"expected {len(chunks)} vectors of {dim}, got {vectors.shape}")
    flat = pa.array(vectors.astype(np.float32).ravel(), type=pa.float32())
    return pa.table(
        {
            "chunk_id": [c.chunk_id for c in chunks],
            "doc_key": [version_key(c.visibility.tenant, c.doc_id, c.version) for c in chunks],
            "tenant": [c.visibility.tenant for c in chunks],
            "region": [c.visibility.region for c in chunks],
            "acl": [list(c.visibility.acl) for c in chunks],
            "effective_from": [day_number(c.visibility.effective_from) for c in chunks],
            "effective_to": [day_number(c.visibility.effective_to) for c in chunks],
            "vector": pa.FixedSizeListArray.from_arrays(flat, dim),
        },
        schema=_schema(dim),
    )


# The restriction compiled for LanceDB (DataFusion SQL); `visible()` is what it must equal.
def sql_string(value: str) -> str:
    """A SQL string literal: quotes doubled, NUL refused (never valid in our identifiers)."""
    if "\x00" in value:
        raise ValueError("NUL character in filter value")
    return "'" + value.replace("'", "''") + "'"


def _sql_list(values: frozenset[str]) -> str:
    return "[" + ", ".join(sql_string(v) for v in sorted(values)) + "]"


def to_sql_where(restriction: Restriction) -> str:
    """The LanceDB (DataFusion SQL) prefilter for a restriction; 'false' when empty."""
    if restriction.is_empty:
        return "false"
    as_of = day_number(restriction.as_of)
    return (
        f"tenant = {sql_string(restriction.tenant)}"
        f" AND region IN ({', '.join(sql_string(r) for r in sorted(restriction.regions))})"
        f" AND array_has_any(acl, {_sql_list(restriction.principals)})"
        f" AND effective_from <= {as_of} AND effective_to >= {as_of}"
    )
