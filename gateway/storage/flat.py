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

from gateway.retrieval.universe import Restriction, day_number
from gateway.storage.vectors import Snapshot, VectorHit

# Restrictions whose permitted rows are kept, most recent first: callers with the same
# groups, tenant, regions and day share one. Compiling the mask costs about a millisecond
# per 100,000 rows; the copy is per generation, so an ACL change starts a fresh cache.
PERMITTED_CACHE = 64


class FlatVectors:
    def __init__(self, snapshot: Snapshot) -> None:
        """Rows streamed batch by batch (chunk_id, tenant, region, acl, effective_from,
        effective_to, vector) into one preallocated matrix: at a million chunks a whole
        Arrow table beside the matrix doubled the 1.5 GB peak, and per-row Python objects
        cost seconds of startup."""
        self.size = snapshot.rows
        self.matrix = np.empty((self.size, snapshot.dim), dtype=np.float32)
        columns: dict[str, list[pa.Array]] = {name: [] for name in _KEPT}
        at = 0
        for batch in snapshot.batches:
            n = batch.num_rows
            if at + n > self.size:
                raise RuntimeError("vector table grew while being read")
            vectors = batch.column("vector").flatten().to_numpy(zero_copy_only=False)
            self.matrix[at : at + n] = vectors.reshape(n, snapshot.dim)
            for name in _KEPT:
                columns[name].append(batch.column(name))
            at += n
        if at != self.size:
            raise RuntimeError(f"vector table has {at} rows, expected {self.size}")
        _normalise(self.matrix)
        column = {name: pa.chunked_array(parts, _TYPES[name]) for name, parts in columns.items()}
        self._chunk_ids = column["chunk_id"].combine_chunks()
        self._tenant, self._tenants = _codes(column["tenant"])
        self._region, self._regions = _codes(column["region"])
        self._from = column["effective_from"].to_numpy().astype(np.int32)
        self._to = column["effective_to"].to_numpy().astype(np.int32)
        self._acl_rows = _rows_by_value(column["acl"].combine_chunks())
        self._permitted: OrderedDict[Restriction, np.ndarray] = OrderedDict()
        self._permitted_lock = threading.Lock()

    @property
    def principals(self) -> frozenset[str]:
        """Every principal some chunk's ACL names."""
        return frozenset(self._acl_rows)

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
        if rows.size * 4 > self.size:
            # A large share of the table: scoring every row beats copying the permitted
            # ones out first; only permitted rows' scores are read from it.
            scores = (self.matrix @ query)[rows]
        else:
            scores = self.matrix[rows] @ query
        if rows.size > limit:
            best = np.argpartition(-scores, limit - 1)[:limit]
        else:
            best = np.arange(rows.size)
        best = best[np.lexsort((rows[best], -scores[best]))]  # ties: stable by row
        ids = self._chunk_ids.take(pa.array(rows[best])).to_pylist()
        return [VectorHit(str(c), float(1.0 - scores[i])) for c, i in zip(ids, best, strict=True)]


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
    """(a small integer per row, value -> integer)."""
    encoded = values.combine_chunks().dictionary_encode()
    codes = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int32)
    return codes, {v: i for i, v in enumerate(encoded.dictionary.to_pylist())}


def _rows_by_value(lists: pa.ListArray) -> dict[str, np.ndarray]:
    """principal -> the rows whose ACL names it, ascending."""
    owners = pc.list_parent_indices(lists).to_numpy()
    codes, names = _codes(pa.chunked_array([lists.flatten()]))
    order = np.argsort(codes, kind="stable")  # keeps each principal's rows ascending
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    return {
        name: owners[order[bounds[i] : bounds[i + 1]]].astype(np.int64) for name, i in names.items()
    }
