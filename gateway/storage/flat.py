"""Exact (flat) vector search over an in-memory copy of one generation's chunk table.

LanceDB spends about 10 ms of fixed cost on every query here, whatever the table size;
for a restricted universe of a few thousand chunks the whole exact search costs well under
a millisecond. So the dense lane asks this copy first: the restriction is compiled into a
row mask (the third compilation of `Restriction`, tested against `visible()` like the
other two), only permitted rows are scored, and their exact top k comes back. Universes
too large for a cheap exact pass go to LanceDB (see `DenseLane`).

The copy of a new generation is built from the previous one: the visibility columns are
read again (they change with every ACL revision), but a vector is read from the table only
for rows the previous copy does not hold. LanceDB never rewrites a data file, so a row
address (fragment, offset) names the same vector in every version, and every new or
rewritten row sits in a fragment newer than any the previous copy saw. The copy can live in
a file (`gateway/storage/flatfile.py`), memory-mapped, so a restart need not rebuild it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gateway.restriction import Restriction, day_number
from gateway.storage.vectors import ADDRESS, Snapshot, VectorHit

# Restrictions whose permitted rows are kept, most recent first: callers with the same
# groups, tenant, regions and day share one. Compiling the mask costs about a millisecond
# per 100,000 rows; the copy is per generation, so an ACL change starts a fresh cache.
PERMITTED_CACHE = 64
# Runs of permitted rows are scored in place when they average this many rows: a call
# per run costs about 15 us, gathering a row 0.05-0.6 us (cached or not; measured at
# 1.4k and 1M rows).
MIN_RUN = 64
TIE = 1e-6  # cosine scores closer than this are ranked as equal
COPY_BLOCK = 65536  # rows copied from the previous copy at a time

Allocate = Callable[[int, int], np.ndarray]  # (rows, dim) -> an uninitialised float32 matrix


def in_memory(rows: int, dim: int) -> np.ndarray:
    return np.empty((rows, dim), dtype=np.float32)


@dataclass(frozen=True)
class Clustered:
    """One generation's rows in clustered order, all but their vectors: rows with the same
    tenant, region, ACL and dates sit together, so a caller's permitted rows form a few
    contiguous runs that are scored in place, instead of 150 MB gathered per query at 10%
    of a million chunks."""

    chunk_ids: pa.Array  # string
    addresses: np.ndarray  # uint64: the row's address in the table
    table_row: np.ndarray  # int64: the row's position in the table's scan order
    tenant: np.ndarray  # int32 codes of `tenants`
    region: np.ndarray  # int32 codes of `regions`
    starts: np.ndarray  # int32 day numbers
    ends: np.ndarray
    acl: pa.ListArray
    tenants: dict[str, int]
    regions: dict[str, int]

    @property
    def size(self) -> int:
        return len(self.chunk_ids)


class FlatVectors:
    def __init__(self, rows: Clustered, matrix: np.ndarray) -> None:
        """`matrix` holds the unit vectors of `rows`, in the same order."""
        if matrix.shape[0] != rows.size:
            raise RuntimeError(f"{matrix.shape[0]} vectors for {rows.size} rows")
        self.rows, self.matrix, self.size = rows, matrix, rows.size
        self._acl_rows = _rows_by_value(rows.acl)
        self.principals = frozenset(self._acl_rows)  # every principal some chunk's ACL names
        self._permitted: OrderedDict[Restriction, np.ndarray] = OrderedDict()
        self._permitted_lock = threading.Lock()
        self._documents_made: Documents | None = None
        self._documents_lock = threading.Lock()
        # Per lane thread, the last (rows, query vector, scores): a search by document asks
        # again deeper (until it holds enough documents), and then for whole documents,
        # with the very same rows and vector; each asking scored every permitted row anew.
        self._last = threading.local()

    @classmethod
    def build(
        cls, snapshot: Snapshot, base: FlatVectors | None = None, allocate: Allocate = in_memory
    ) -> FlatVectors:
        """The copy of the pinned table: its visibility columns streamed in one pass, then
        the vectors, each written straight to its row of one matrix (a whole Arrow table
        beside the matrix doubled the peak). With `base`, the copy of an earlier version
        of the same table, only vectors `base` lacks are read."""
        rows = _clustered(snapshot)
        matrix = allocate(rows.size, snapshot.dim)
        if base is None or snapshot.read_from is None or not _reuse(rows, base, snapshot, matrix):
            _read_all(rows, snapshot, matrix)
        return cls(rows, matrix)

    def chunk_id(self, row: int) -> str:
        return str(self.rows.chunk_ids[row].as_py())

    def mask(self, restriction: Restriction) -> np.ndarray:
        """Rows the restriction admits: the same rules as `visible()`, as array operations."""
        admitted = np.zeros(self.size, dtype=bool)
        rows = self.rows
        tenant = rows.tenants.get(restriction.tenant)
        if restriction.is_empty or tenant is None:
            return admitted
        for principal in restriction.principals:
            found = self._acl_rows.get(principal)
            if found is not None:
                admitted[found] = True
        regions = [rows.regions[r] for r in restriction.regions if r in rows.regions]
        as_of = day_number(restriction.as_of)
        admitted &= rows.tenant == tenant
        admitted &= np.isin(rows.region, regions)
        admitted &= (rows.starts <= as_of) & (rows.ends >= as_of)
        return admitted

    def permitted_rows(self, restriction: Restriction) -> np.ndarray:
        """The admitted rows, ascending (read-only: shared between requests)."""
        with self._permitted_lock:
            rows = self._permitted.get(restriction)
            if rows is not None:
                self._permitted.move_to_end(restriction)
                return rows
        rows = np.flatnonzero(self.mask(restriction))
        rows.flags.writeable = False
        with self._permitted_lock:
            self._permitted[restriction] = rows
            if len(self._permitted) > PERMITTED_CACHE:
                self._permitted.popitem(last=False)
        return rows

    def search(self, rows: np.ndarray, vector: np.ndarray, limit: int) -> list[VectorHit]:
        """Exact cosine top `limit` among `rows` only: nothing outside them is scored."""
        if rows.size == 0 or limit <= 0:
            return []
        scores = self._scores(rows, vector)
        if rows.size > limit:
            best = np.argpartition(-scores, limit - 1)[:limit]
        else:
            best = np.arange(rows.size)
        best = best[np.argsort(-scores[best], kind="stable")]
        # Ties go by the table's own row order, as LanceDB breaks them. Equal vectors can
        # score a rounding step apart (the product runs over different slices), so scores
        # closer than TIE count as tied.
        tied = np.concatenate(([0], np.cumsum(np.diff(scores[best]) < -TIE)))
        best = best[np.lexsort((self.rows.table_row[rows[best]], tied))]
        return self._hits(rows[best], scores[best])

    def search_documents(
        self, rows: np.ndarray, vector: np.ndarray, limit: int, kind: str
    ) -> list[VectorHit]:
        """Exact cosine top `limit` whole documents among `rows` (all of a version's
        chunks share its visibility, so a document is permitted whole or not at all),
        each named by its first chunk: by the mean of its chunk vectors (`mean`: the sum
        of its chunks' scores over the length of their vector sum), or by its first
        chunk's vector (`first`)."""
        if rows.size == 0 or limit <= 0:
            return []
        documents = self._documents()
        scores = self._scores(rows, vector)
        codes = documents.codes[rows]
        if kind == "mean":
            found = np.unique(codes)
            totals = np.bincount(codes, weights=scores, minlength=documents.count)
            document_scores = totals[found] / documents.norms[found]
        else:
            firsts = rows == documents.first_row[codes]
            found, document_scores = codes[firsts], scores[firsts]
        best = np.argsort(-document_scores, kind="stable")[:limit]
        return self._hits(documents.first_row[found[best]], document_scores[best])

    def _scores(self, rows: np.ndarray, vector: np.ndarray) -> np.ndarray:
        """The cosine of each of `rows` (ascending) with `vector` (read-only). The same
        two arrays (the cached permitted rows and query vector: neither can change) asked
        again on one thread get the scores of the last asking."""
        last = getattr(self._last, "scored", None)
        if last is not None and last[0] is rows and last[1] is vector:
            kept: np.ndarray = last[2]
            return kept
        scores = self._scored(rows, vector)
        scores.flags.writeable = False
        if not rows.flags.writeable and not vector.flags.writeable:
            self._last.scored = (rows, vector, scores)
        return scores

    def _scored(self, rows: np.ndarray, vector: np.ndarray) -> np.ndarray:
        query = vector.astype(np.float32)
        query /= max(float(np.linalg.norm(query)), 1e-12)
        # Runs of consecutive permitted rows (the clustered order) are scored in place;
        # rows scattered in short runs are gathered first. Either way only permitted
        # rows are ever scored.
        cuts = np.flatnonzero(np.diff(rows) != 1) + 1
        if cuts.size * MIN_RUN < rows.size:
            starts, ends = np.concatenate(([0], cuts)), np.concatenate((cuts, [rows.size]))
            return np.concatenate(
                [
                    self.matrix[rows[a] : rows[b - 1] + 1] @ query
                    for a, b in zip(starts, ends, strict=True)
                ]
            )
        gathered: np.ndarray = self.matrix[rows] @ query
        return gathered

    def _hits(self, rows: np.ndarray, scores: np.ndarray) -> list[VectorHit]:
        ids = self.rows.chunk_ids.take(pa.array(rows)).to_pylist()
        distances = (1.0 - scores).tolist()  # one conversion, not one per hit
        return [VectorHit(c, d) for c, d in zip(ids, distances, strict=True)]

    def _documents(self) -> Documents:
        """Which document version each row is a chunk of; made on first use (only
        `document_vector` asks), once per copy."""
        with self._documents_lock:
            if self._documents_made is None:
                self._documents_made = Documents.of(self.rows, self.matrix)
            return self._documents_made


@dataclass(frozen=True)
class Documents:
    codes: np.ndarray  # int64 per row: its document version
    first_row: np.ndarray  # per document: the row of its first chunk (lowest ordinal)
    norms: np.ndarray  # per document: the length of the sum of its chunks' unit vectors
    count: int

    @classmethod
    def of(cls, rows: Clustered, matrix: np.ndarray) -> Documents:
        from scipy import sparse  # here: only a search by document needs it (70 ms to load)

        ids = rows.chunk_ids
        parts = pc.split_pattern(ids, ":", max_splits=1, reverse=True)
        version = pc.list_element(parts, 0)  # chunk IDs are <doc_id>@<version>:<n>
        ordinal = pc.cast(pc.list_element(parts, 1), pa.int64()).to_numpy()
        keyed = pc.binary_join_element_wise(pa.array(rows.tenant.astype(str)), version, "\x1f")
        codes, _ = _codes(pa.chunked_array([keyed]))
        codes = codes.astype(np.int64)
        count = int(codes.max(initial=-1)) + 1
        by_ordinal = np.lexsort((ordinal, codes))  # each document's rows, first chunk first
        first_row = np.empty(count, dtype=np.int64)
        starts = np.flatnonzero(np.diff(codes[by_ordinal], prepend=-1))
        first_row[codes[by_ordinal[starts]]] = by_ordinal[starts]
        membership = sparse.csr_matrix(
            (np.ones(rows.size, dtype=np.float32), (codes, np.arange(rows.size))),
            shape=(count, rows.size),
        )
        sums = np.asarray(membership @ matrix)
        norms = np.maximum(np.sqrt(np.einsum("ij,ij->i", sums, sums)), 1e-12)
        return cls(codes, first_row, norms, count)


_KEPT = (ADDRESS, "chunk_id", "tenant", "region", "acl", "effective_from", "effective_to")
_TYPES = {
    ADDRESS: pa.uint64(),
    "chunk_id": pa.string(),
    "tenant": pa.string(),
    "region": pa.string(),
    "acl": pa.list_(pa.string()),
    "effective_from": pa.int32(),
    "effective_to": pa.int32(),
}
_VECTORS = (ADDRESS, "vector")


def _clustered(snapshot: Snapshot) -> Clustered:
    """The visibility columns of every row, in clustered order."""
    parts: dict[str, list[pa.Array]] = {name: [] for name in _KEPT}
    for batch in snapshot.read(_KEPT):
        for name in _KEPT:
            parts[name].append(batch.column(name))
    column = {name: pa.chunked_array(part, _TYPES[name]) for name, part in parts.items()}
    addresses = column[ADDRESS].to_numpy()
    if len(addresses) != snapshot.rows:
        raise RuntimeError(f"vector table has {len(addresses)} rows, expected {snapshot.rows}")
    tenant, tenants = _codes(column["tenant"])
    region, regions = _codes(column["region"])
    starts = column["effective_from"].to_numpy().astype(np.int32)
    ends = column["effective_to"].to_numpy().astype(np.int32)
    acl = column["acl"].combine_chunks()
    acl_set, _ = _codes(pa.chunked_array([pc.binary_join(acl, "\x1f")]))
    order = np.lexsort((starts, ends, acl_set, region, tenant))  # last key sorts first
    taken = pa.array(order)
    return Clustered(
        chunk_ids=column["chunk_id"].combine_chunks().take(taken),
        addresses=addresses[order],
        table_row=order,
        tenant=tenant[order],
        region=region[order],
        starts=starts[order],
        ends=ends[order],
        acl=acl.take(taken),
        tenants=tenants,
        regions=regions,
    )


class _Addresses:
    """Finds rows by their table address (a sorted copy and binary search: no hash table
    of a million entries per batch)."""

    def __init__(self, addresses: np.ndarray) -> None:
        self._order = np.argsort(addresses, kind="stable")
        self._sorted = addresses[self._order]

    def find(self, addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(which of `addresses` are here, and their rows for those that are)."""
        at = np.searchsorted(self._sorted, addresses)
        at_clipped = np.minimum(at, max(self._sorted.size - 1, 0))
        found = (at < self._sorted.size) & (self._sorted[at_clipped] == addresses)
        return found, self._order[at_clipped[found]]


def _fill(rows: Clustered, batches: Iterable[pa.RecordBatch], matrix: np.ndarray) -> int:
    """Write each batch's vectors (unit length) to the rows of their addresses; returns
    how many rows were written."""
    locate, written, dim = _Addresses(rows.addresses), 0, matrix.shape[1]
    for batch in batches:
        found, at = locate.find(batch.column(ADDRESS).to_numpy(zero_copy_only=False))
        if not found.all():
            raise RuntimeError("the vector table gave rows its first pass did not")
        vectors = batch.column("vector").flatten().to_numpy(zero_copy_only=False)
        part = vectors.reshape(batch.num_rows, dim).astype(np.float32)
        _normalise(part)
        matrix[at] = part
        written += batch.num_rows
    return written


def _read_all(rows: Clustered, snapshot: Snapshot, matrix: np.ndarray) -> None:
    if _fill(rows, snapshot.read(_VECTORS), matrix) != rows.size:
        raise RuntimeError(f"the vector table did not give {rows.size} vectors")


def _reuse(rows: Clustered, base: FlatVectors, snapshot: Snapshot, matrix: np.ndarray) -> bool:
    """Copy from `base` the vectors it holds and read the rest from the table; False (and
    nothing promised about `matrix`) when the new rows are not all in newer fragments,
    as after a compaction: then every vector is read."""
    assert snapshot.read_from is not None
    found, at = _Addresses(base.rows.addresses).find(rows.addresses)
    missing = rows.addresses[~found]
    newer_than = int(base.rows.addresses.max()) >> 32 if base.size else -1
    first_new = (newer_than + 1) << 32
    if missing.size and int(missing.min()) < first_new:
        return False
    # Copied run by run of consecutive rows kept: `take` into a slice is about 8 times
    # faster than assigning to rows picked by an index array (0.5 s against 4 s at 1M).
    reused = np.flatnonzero(found)
    cuts = np.flatnonzero(np.diff(reused) != 1) + 1
    runs = zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [reused.size])), strict=True)
    for first, end in runs:
        for start in range(int(first), int(end), COPY_BLOCK):
            stop = min(start + COPY_BLOCK, int(end))
            row = int(reused[start])
            np.take(base.matrix, at[start:stop], axis=0, out=matrix[row : row + stop - start])
    if missing.size == 0:
        return True
    return bool(_fill(rows, snapshot.read_from(first_new, _VECTORS), matrix) == missing.size)


def _normalise(matrix: np.ndarray, block: int = 65536) -> None:
    """Unit rows, in place, so the dot product is the cosine LanceDB computes. Ingest
    stores unit vectors already; this keeps the two engines equal for any table."""
    for start in range(0, len(matrix), block):
        part = matrix[start : start + block]
        norms = np.sqrt(np.einsum("ij,ij->i", part, part))
        if np.abs(norms - 1.0).max(initial=0.0) > 1e-6:
            part /= np.maximum(norms, 1e-12)[:, None]


def _codes(values: pa.ChunkedArray) -> tuple[np.ndarray, dict[str, int]]:
    """(an integer per row, value -> integer), the integers in the values' sorted order:
    equal values, and values sharing a prefix, sort together."""
    encoded = values.combine_chunks().dictionary_encode()
    rank = np.empty(len(encoded.dictionary), dtype=np.int32)
    rank[pc.sort_indices(encoded.dictionary).to_numpy()] = np.arange(rank.size)
    codes: np.ndarray = rank[encoded.indices.to_numpy(zero_copy_only=False)]
    return codes, {v: int(rank[i]) for i, v in enumerate(encoded.dictionary.to_pylist())}


def _rows_by_value(lists: pa.ListArray) -> dict[str, np.ndarray]:
    """principal -> the rows whose ACL names it, ascending."""
    owners = pc.list_parent_indices(lists).to_numpy()
    codes, names = _codes(pa.chunked_array([lists.flatten()]))
    order = np.argsort(codes, kind="stable")  # keeps each principal's rows ascending
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    return {
        name: owners[order[bounds[i] : bounds[i + 1]]].astype(np.int64) for name, i in names.items()
    }
