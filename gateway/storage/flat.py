"""Exact (flat) vector search over an in-memory copy of one generation's chunk table.

LanceDB spends about 10 ms of fixed cost on every query here, whatever the table size;
for a restricted universe of a few thousand chunks the whole exact search costs well under
a millisecond. So the dense lane asks this copy first: the restriction is compiled into a
row mask (the third compilation of `Restriction`, tested against `visible()` like the
other two), only permitted rows are scored, and their exact top k comes back. Universes
too large for a cheap exact pass go to LanceDB (see `DenseLane`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gateway.restriction import Restriction, day_number
from gateway.storage.vectors import Snapshot, VectorHit

# Restrictions whose permitted rows are kept, most recent first: callers with the same
# groups, tenant, regions and day share one. Compiling the mask costs about a millisecond
# per 100,000 rows; the copy is per generation, so an ACL change starts a fresh cache.
PERMITTED_CACHE = 64
# Runs of permitted rows are scored in place when they average this many rows: a call
# per run costs about 15 us, gathering a row 0.05-0.6 us (cached or not; measured at
# 1.4k and 1M rows).
MIN_RUN = 64
TIE = 1e-6  # cosine scores closer than this are ranked as equal


class FlatVectors:
    def __init__(self, snapshot: Snapshot) -> None:
        """Two streamed passes over the pinned table. The visibility columns come first
        and decide the row order: rows with the same tenant, region, ACL and dates sit
        together, so a caller's permitted rows form a few contiguous runs that are scored
        in place, instead of 150 MB gathered per query at 10% of a million chunks. The
        vectors follow, each batch written straight to its rows of one preallocated
        matrix: a whole Arrow table beside the matrix doubled the 1.5 GB peak."""
        self.size, dim = snapshot.rows, snapshot.dim
        parts: dict[str, list[pa.Array]] = {name: [] for name in _KEPT}
        for batch in snapshot.read(_KEPT):
            for name in _KEPT:
                parts[name].append(batch.column(name))
        column = {name: pa.chunked_array(part, _TYPES[name]) for name, part in parts.items()}
        stored_ids = column["chunk_id"].combine_chunks()
        if len(stored_ids) != self.size:
            raise RuntimeError(f"vector table has {len(stored_ids)} rows, expected {self.size}")
        tenant, self._tenants = _codes(column["tenant"])
        region, self._regions = _codes(column["region"])
        starts = column["effective_from"].to_numpy().astype(np.int32)
        ends = column["effective_to"].to_numpy().astype(np.int32)
        acl = column["acl"].combine_chunks()
        acl_set, _ = _codes(pa.chunked_array([pc.binary_join(acl, "\x1f")]))
        order = np.lexsort((starts, ends, acl_set, region, tenant))  # last key sorts first
        self._table_row = order  # clustered row -> row in the table
        self._chunk_ids = stored_ids.take(pa.array(order))
        self._tenant, self._region = tenant[order], region[order]
        self._from, self._to = starts[order], ends[order]
        self._acl_rows = _rows_by_value(acl.take(pa.array(order)))
        self.principals = frozenset(self._acl_rows)  # every principal some chunk's ACL names

        position = np.empty(self.size, dtype=np.int64)
        position[order] = np.arange(self.size)
        self.matrix = np.empty((self.size, dim), dtype=np.float32)
        at = 0
        for batch in snapshot.read(("chunk_id", "vector")):
            n = batch.num_rows
            if not batch.column("chunk_id").equals(stored_ids.slice(at, n)):
                raise RuntimeError("vector table rows came back in another order")
            vectors = batch.column("vector").flatten().to_numpy(zero_copy_only=False)
            self.matrix[position[at : at + n]] = vectors.reshape(n, dim)
            at += n
        if at != self.size:
            raise RuntimeError(f"vector table has {at} vectors, expected {self.size}")
        _normalise(self.matrix)
        self._permitted: OrderedDict[Restriction, np.ndarray] = OrderedDict()
        self._permitted_lock = threading.Lock()

    def chunk_id(self, row: int) -> str:
        return str(self._chunk_ids[row].as_py())

    def mask(self, restriction: Restriction) -> np.ndarray:
        """Rows the restriction admits: the same rules as `visible()`, as array operations."""
        admitted = np.zeros(self.size, dtype=bool)
        tenant = self._tenants.get(restriction.tenant)
        if restriction.is_empty or tenant is None:
            return admitted
        for principal in restriction.principals:
            rows = self._acl_rows.get(principal)
            if rows is not None:
                admitted[rows] = True
        regions = [self._regions[r] for r in restriction.regions if r in self._regions]
        as_of = day_number(restriction.as_of)
        admitted &= self._tenant == tenant
        admitted &= np.isin(self._region, regions)
        admitted &= (self._from <= as_of) & (self._to >= as_of)
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
        query = vector.astype(np.float32)
        query /= max(float(np.linalg.norm(query)), 1e-12)
        # Runs of consecutive permitted rows (the clustered order) are scored in place;
        # rows scattered in short runs are gathered first. Either way only permitted
        # rows are ever scored.
        cuts = np.flatnonzero(np.diff(rows) != 1) + 1
        if cuts.size * MIN_RUN < rows.size:
            starts, ends = np.concatenate(([0], cuts)), np.concatenate((cuts, [rows.size]))
            scores = np.concatenate(
                [
                    self.matrix[rows[a] : rows[b - 1] + 1] @ query
                    for a, b in zip(starts, ends, strict=True)
                ]
            )
        else:
            scores = self.matrix[rows] @ query
        if rows.size > limit:
            best = np.argpartition(-scores, limit - 1)[:limit]
        else:
            best = np.arange(rows.size)
        best = best[np.argsort(-scores[best], kind="stable")]
        # Ties go by the table's own row order, as LanceDB breaks them. Equal vectors can
        # score a rounding step apart (the product runs over different slices), so scores
        # closer than TIE count as tied.
        tied = np.concatenate(([0], np.cumsum(np.diff(scores[best]) < -TIE)))
        best = best[np.lexsort((self._table_row[rows[best]], tied))]
        ids = self._chunk_ids.take(pa.array(rows[best])).to_pylist()
        distances = (1.0 - scores[best]).tolist()  # one conversion, not one per hit
        return [VectorHit(c, d) for c, d in zip(ids, distances, strict=True)]


_KEPT = ("chunk_id", "tenant", "region", "acl", "effective_from", "effective_to")
_TYPES = {
    "chunk_id": pa.string(),
    "tenant": pa.string(),
    "region": pa.string(),
    "acl": pa.list_(pa.string()),
    "effective_from": pa.int32(),
    "effective_to": pa.int32(),
}


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
