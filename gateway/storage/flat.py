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
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from gateway.retrieval.universe import Restriction, day_number
from gateway.storage.vectors import VectorHit

# Restrictions whose permitted rows are kept, most recent first: callers with the same
# groups, tenant, regions and day share one. Compiling the mask costs about a millisecond
# per 100,000 rows; the copy is per generation, so an ACL change starts a fresh cache.
PERMITTED_CACHE = 64


class FlatVectors:
    def __init__(self, table: pa.Table) -> None:
        """`table`: chunk_id, tenant, region, acl, effective_from, effective_to, vector."""
        self.size = table.num_rows
        self.chunk_ids: list[str] = table.column("chunk_id").to_pylist()
        vectors = table.column("vector").combine_chunks()
        dim = vectors.type.list_size
        flat = vectors.flatten().to_numpy(zero_copy_only=False)
        matrix = np.ascontiguousarray(flat.reshape(self.size, dim), dtype=np.float32)
        # Unit rows make the dot product the cosine LanceDB computes (ingest stores unit
        # vectors already; this keeps the two engines equal for any table).
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        self.matrix = matrix / np.maximum(norms, 1e-12)
        self._tenant, self._tenants = _codes(table.column("tenant").to_pylist())
        self._region, self._regions = _codes(table.column("region").to_pylist())
        self._from = table.column("effective_from").to_numpy().astype(np.int32)
        self._to = table.column("effective_to").to_numpy().astype(np.int32)
        self._acl_rows = _rows_by_value(table.column("acl").combine_chunks())
        self._permitted: OrderedDict[Restriction, np.ndarray] = OrderedDict()
        self._permitted_lock = threading.Lock()

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
        return [VectorHit(self.chunk_ids[rows[i]], float(1.0 - scores[i])) for i in best]


def _codes(values: Sequence[str]) -> tuple[np.ndarray, dict[str, int]]:
    table: dict[str, int] = {}
    codes = np.fromiter((table.setdefault(v, len(table)) for v in values), dtype=np.int32)
    return codes, table


def _rows_by_value(lists: pa.ListArray) -> dict[str, np.ndarray]:
    """principal -> the rows whose ACL names it."""
    owners = np.repeat(np.arange(len(lists)), np.diff(lists.offsets.to_numpy()))
    values = lists.flatten().to_pylist()
    grouped: dict[str, list[int]] = {}
    for value, row in zip(values, owners.tolist(), strict=True):
        grouped.setdefault(value, []).append(row)
    return {value: np.asarray(rows, dtype=np.int64) for value, rows in grouped.items()}
