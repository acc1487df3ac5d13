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

Scoring is bound by memory, not arithmetic: at 10% of 200k chunks the exact pass reads
31 MB of float32 per query. So a large universe is screened first in half precision (half
the bytes, about twice as fast), with a proven bound on how far a screened score can be
from the float32 one; every row that could still be among the best is then scored again in
float32 from the float32 copy. The result is the float32 result, row for row.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, NamedTuple

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
# Universes from this many permitted rows are screened in half precision first: below it
# the float32 pass takes under 0.2 ms and screening gains nothing (measured, see CHANGELOG).
SCREEN_FROM = 2048

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
    def __init__(
        self,
        rows: Clustered,
        matrix: np.ndarray,
        half: np.ndarray | None = None,
        screen: bool = True,
    ) -> None:
        """`matrix` holds the unit vectors of `rows`, in the same order; `half` the same in
        half precision (`half_precision`), for screening, or None: then it is made here
        when the table is large enough for screening to pay (in private memory), unless
        `screen` is false (a copy only read to build another never searches)."""
        if matrix.shape[0] != rows.size:
            raise RuntimeError(f"{matrix.shape[0]} vectors for {rows.size} rows")
        if half is not None and half.shape != matrix.shape:
            raise RuntimeError(f"half-precision copy of {half.shape}, not {matrix.shape}")
        self.rows, self.matrix, self.size = rows, matrix, rows.size
        if half is None and screen and keeps_half(rows.size):
            half = half_precision(matrix, np.empty(matrix.shape, dtype=np.float16))
        self.half = half
        self._screened = _as_tensor(half)  # what screening reads; None without torch
        self._acl_rows = _rows_by_value(rows.acl)
        self.principals = frozenset(self._acl_rows)  # every principal some chunk's ACL names
        self._permitted: OrderedDict[Restriction, _Permitted] = OrderedDict()
        self._permitted_lock = threading.Lock()
        self._documents_made: Documents | None = None
        self._documents_lock = threading.Lock()
        # Per lane thread, the last (rows, query vector, scores): a search by document asks
        # again deeper (until it holds enough documents), and then for whole documents,
        # with the very same rows and vector; each asking scored every permitted row anew.
        self._last = threading.local()

    @classmethod
    def build(
        cls,
        snapshot: Snapshot,
        base: FlatVectors | None = None,
        allocate: Allocate = in_memory,
        screen: bool = True,
    ) -> FlatVectors:
        """The copy of the pinned table: its visibility columns streamed in one pass, then
        the vectors, each written straight to its row of one matrix (a whole Arrow table
        beside the matrix doubled the peak). With `base`, the copy of an earlier version
        of the same table, only vectors `base` lacks are read. `screen` as for the
        constructor (a copy written to files gets its twin there instead)."""
        rows = _clustered(snapshot)
        matrix = allocate(rows.size, snapshot.dim)
        if base is None or snapshot.read_from is None or not _reuse(rows, base, snapshot, matrix):
            _read_all(rows, snapshot, matrix)
        return cls(rows, matrix, screen=screen)

    def chunk_id(self, row: int) -> str:
        return str(self.rows.chunk_ids[row].as_py())

    def admitted(self, restriction: Restriction) -> np.ndarray:
        """Rows the restriction admits, ascending: the same rules as `visible()`, as array
        operations over the caller's tenant's rows only (rows are clustered by tenant
        first), so that their cost does not grow with what other tenants hold."""
        rows = self.rows
        tenant = rows.tenants.get(restriction.tenant)
        if restriction.is_empty or tenant is None:
            return np.empty(0, dtype=np.int64)
        lo, hi = (int(i) for i in np.searchsorted(rows.tenant, [tenant, tenant + 1]))
        admitted = np.zeros(hi - lo, dtype=bool)
        for principal in restriction.principals:
            found = self._acl_rows.get(principal)
            if found is not None:
                start, end = np.searchsorted(found, [lo, hi])
                admitted[found[start:end] - lo] = True
        regions = [rows.regions[r] for r in restriction.regions if r in rows.regions]
        as_of = day_number(restriction.as_of)
        admitted &= np.isin(rows.region[lo:hi], regions)
        admitted &= (rows.starts[lo:hi] <= as_of) & (rows.ends[lo:hi] >= as_of)
        return lo + np.flatnonzero(admitted)

    def permitted_rows(self, restriction: Restriction) -> np.ndarray:
        """The admitted rows, ascending (read-only: shared between requests)."""
        with self._permitted_lock:
            kept = self._permitted.get(restriction)
            if kept is not None:
                self._permitted.move_to_end(restriction)
                return kept.rows
        rows = self.admitted(restriction)
        rows.flags.writeable = False
        with self._permitted_lock:
            # Another thread may have made them meanwhile: every thread then shares its.
            kept = self._permitted.setdefault(restriction, _Permitted(rows))
            self._permitted.move_to_end(restriction)
            if len(self._permitted) > PERMITTED_CACHE:
                self._permitted.popitem(last=False)
        return kept.rows

    def search(self, rows: np.ndarray, vector: np.ndarray, limit: int) -> list[VectorHit]:
        """Exact cosine top `limit` among `rows` only: nothing outside them is scored."""
        return _as_hits(self.ranked(rows, vector, limit))

    def ranked(self, rows: np.ndarray, vector: np.ndarray, limit: int) -> Ranked:
        """`search`'s hits as two lists, as the dense lane ranks them (no tuple per hit:
        hundreds are made per search, on the lane's critical path)."""
        if rows.size == 0 or limit <= 0:
            return Ranked([], [])
        scores, error = self._scores(rows, vector)
        if error:  # screened: the rows that can still be among the best, in float32
            rows = rows[_contenders(scores, error, limit)]
            scores = self._exact(rows, _unit(vector))
        best = _best(scores, limit, lambda picked: self.rows.table_row[rows[picked]])
        return self._ranked(rows[best], scores[best])

    def search_documents(
        self, rows: np.ndarray, vector: np.ndarray, limit: int, kind: str
    ) -> list[VectorHit]:
        """Exact cosine top `limit` whole documents among `rows` (all of a version's
        chunks share its visibility, so a document is permitted whole or not at all),
        each named by its first chunk: by the mean of its chunk vectors (`mean`: the sum
        of its chunks' scores over the length of their vector sum), or by its first
        chunk's vector (`first`)."""
        return _as_hits(self.ranked_documents(rows, vector, limit, kind))

    def ranked_documents(
        self, rows: np.ndarray, vector: np.ndarray, limit: int, kind: str
    ) -> Ranked:
        """`search_documents`'s hits as two lists (`ranked`)."""
        if rows.size == 0 or limit <= 0:
            return Ranked([], [])
        documents = self.documents()
        scores, error = self._scores(rows, vector)
        grouped = self._grouped(rows, documents)
        if kind == "mean":
            found, place = grouped.found, grouped.place
            totals = np.bincount(place, weights=scores, minlength=found.size)
            document_scores = totals / grouped.norms
            if error:  # each chunk's score is off by at most `error`, so the sum by n times
                keep = _contenders(document_scores, grouped.sizes * error / grouped.norms, limit)
                contending = np.zeros(found.size, dtype=bool)
                contending[keep] = True
                mine = contending[place]  # the chunks of the documents still contending
                exact = self._exact(rows[mine], _unit(vector))
                totals = np.bincount(place[mine], weights=exact, minlength=found.size)
                found, document_scores = found[keep], totals[keep] / grouped.norms[keep]
        else:
            firsts = grouped.firsts
            found, document_scores = documents.codes[rows[firsts]], scores[firsts]
            if error:
                keep = _contenders(document_scores, error, limit)
                found = found[keep]
                document_scores = self._exact(rows[firsts][keep], _unit(vector))
        named_by = documents.first_row[found]  # each document's first chunk
        best = _best(document_scores, limit, lambda picked: self.rows.table_row[named_by[picked]])
        return self._ranked(named_by[best], document_scores[best])

    def _scores(self, rows: np.ndarray, vector: np.ndarray) -> tuple[np.ndarray, float]:
        """(the cosine of each of `rows` (ascending) with `vector`, read-only; how far each
        can be from the float32 cosine: 0 when scored in float32). The same two arrays
        (the cached permitted rows and query vector: neither can change) asked again on
        one thread get the scores of the last asking."""
        last = getattr(self._last, "scored", None)
        if last is not None and last[0] is rows and last[1] is vector:
            kept: tuple[np.ndarray, float] = last[2]
            return kept
        query = _unit(vector)
        if self._screened is not None and rows.size >= SCREEN_FROM:
            scored = (self._screen(rows, query), screen_error(self.matrix.shape[1]))
        else:
            scored = (self._exact(rows, query), 0.0)
        scored[0].flags.writeable = False
        if not rows.flags.writeable and not vector.flags.writeable:
            self._last.scored = (rows, vector, scored)
        return scored

    def _exact(self, rows: np.ndarray, query: np.ndarray) -> np.ndarray:
        """float32 cosines; only `rows` are ever scored."""
        runs = _runs(rows)
        if runs is None:
            gathered: np.ndarray = self.matrix[rows] @ query
            return gathered
        return np.concatenate([self.matrix[a:b] @ query for a, b in runs])

    def _screen(self, rows: np.ndarray, query: np.ndarray) -> np.ndarray:
        """Half-precision cosines, each within `screen_error` of the float32 one."""
        import torch

        assert self._screened is not None
        half, runs = self._screened, _runs(rows)
        with torch.inference_mode(), _one_torch_thread():
            q = torch.from_numpy(query).to(torch.float16)
            if runs is None:
                # index_select copies whole rows; indexing (`half[rows]`) gathers element by
                # element, three times slower for 20,000 rows of 384 (measured, 2026-11-28).
                picked = torch.index_select(half, 0, torch.from_numpy(rows.copy()))  # read-only
                scores = torch.mv(picked, q)
            else:
                scores = torch.cat([torch.mv(half[a:b], q) for a, b in runs])
            screened: np.ndarray = scores.float().numpy()
        return screened

    def _ranked(self, rows: np.ndarray, scores: np.ndarray) -> Ranked:
        ids = self.rows.chunk_ids.take(pa.array(rows)).to_pylist()
        # The similarity as it always was, 1 - the distance LanceDB's hits carry, in
        # float64: the same numbers to the last bit, so fusion's ties fall as before.
        distances = (1.0 - scores).astype(np.float64)
        return Ranked(ids, (1.0 - distances).tolist())

    def _grouped(self, rows: np.ndarray, documents: Documents) -> Grouped:
        """`rows` by document: made once for a cached set of permitted rows and kept with
        it (0.2-0.4 ms a search by document at 20,100 permitted rows, measured
        2026-11-28); made afresh for any other rows."""
        with self._permitted_lock:  # at most PERMITTED_CACHE entries to look through
            kept = next((k for k in self._permitted.values() if k.rows is rows), None)
        if kept is None:
            return Grouped.of(rows, documents)
        if kept.grouped is None:  # two threads may both make it: the same, either kept
            kept.grouped = Grouped.of(rows, documents)
        return kept.grouped

    def documents(self) -> Documents:
        """Which document version each row is a chunk of; made on first use (only
        `document_vector` asks, or the warm where the policy does), once per copy."""
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


@dataclass
class _Permitted:
    """A cached set of permitted rows, and what it holds by document once a search by
    document asked (evicted together)."""

    rows: np.ndarray
    grouped: Grouped | None = None


@dataclass(frozen=True)
class Grouped:
    """A set of permitted rows by document: what a search by document needs of them that
    no query changes."""

    found: np.ndarray  # the documents with a permitted row (their codes), ascending
    place: np.ndarray  # per permitted row: its document's index in `found`
    sizes: np.ndarray  # per found document: its permitted rows
    norms: np.ndarray  # per found document: `Documents.norms`
    firsts: np.ndarray  # the positions, among the rows, of documents' first chunks

    @classmethod
    def of(cls, rows: np.ndarray, documents: Documents) -> Grouped:
        codes = documents.codes[rows]
        # Counting, not np.unique: no sort (0.8 ms of 23,677 SciFact chunks, 0.03 ms)
        sizes = np.bincount(codes, minlength=documents.count)
        found = np.flatnonzero(sizes)
        index = np.zeros(documents.count, dtype=np.intp)  # what bincount takes uncopied
        index[found] = np.arange(found.size)
        firsts = np.flatnonzero(rows == documents.first_row[codes])
        return cls(found, index[codes], sizes[found], documents.norms[found], firsts)


def keeps_half(rows: int) -> bool:
    """Whether a table of `rows` chunks has a half-precision twin: one that small could
    never hold a universe large enough to be screened."""
    return rows >= SCREEN_FROM


def screen_error(dim: int) -> float:
    """How far a screened score can be from the float32 cosine of two unit vectors of
    `dim` components. Each component rounds to half precision with a relative error of at
    most 2**-11 (the query's too), so the product is off by at most 2**-10 times
    sum |x_i q_i| <= |x| |q| = 1; a component below half's normal range loses at most
    2**-25 instead. torch sums the products in float32 (at most dim * 2**-24 of a sum of
    magnitudes at most 1) and rounds the score to half once more (2**-11 of at most 1).
    The float32 score it stands for has a summing error of its own (dim * 2**-24 more).
    tests/test_flat_screening.py checks torch keeps inside this, against float64 and
    against the float32 scores."""
    return 2**-10 + 2**-11 + 2 * dim * 2**-24 + 2 * math.sqrt(dim) * 2**-25


def _unit(vector: np.ndarray) -> np.ndarray:
    query = vector.astype(np.float32)
    query /= max(float(np.linalg.norm(query)), 1e-12)
    return query


class Ranked(NamedTuple):
    """Hits best first: their chunk IDs, and their cosine similarities to the query."""

    chunk_ids: list[str]
    similarities: list[float]


def _as_hits(ranked: Ranked) -> list[VectorHit]:
    return [
        VectorHit(c, 1.0 - s) for c, s in zip(ranked.chunk_ids, ranked.similarities, strict=True)
    ]


def _runs(rows: np.ndarray) -> list[tuple[int, int]] | None:
    """[first, last + 1) of each run of consecutive rows (the clustered order), to score
    in place; None when runs are too short for that, and the rows are gathered instead."""
    cuts = np.flatnonzero(np.diff(rows) != 1) + 1
    if cuts.size * MIN_RUN >= rows.size:
        return None
    starts, ends = np.concatenate(([0], cuts)), np.concatenate((cuts, [rows.size]))
    return [(int(rows[a]), int(rows[b - 1]) + 1) for a, b in zip(starts, ends, strict=True)]


def _best(
    scores: np.ndarray, limit: int, table_rows: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    """Positions of the best `limit` of `scores`, best first. Ties go by the table's own
    row order (`table_rows` of positions), as LanceDB breaks them, also for the last
    places. Equal vectors can score a rounding step apart (the product runs over
    different slices), so scores within TIE of a tie's best count as tied: two copies of
    one text rank the same way whoever asks, by chunk and by document. A tie is measured
    from its best score, not from one neighbour to the next, so the best `limit` are the
    first `limit` of any longer list."""
    if limit <= 0 or scores.size == 0:
        return np.empty(0, dtype=np.intp)
    if scores.size > limit:  # the best `limit`, and every one tied with the last of them
        last = np.partition(scores, scores.size - limit)[scores.size - limit]
        best = np.flatnonzero(scores >= last - TIE)
    else:
        best = np.arange(scores.size)
    best = best[np.argsort(-scores[best], kind="stable")]
    falling = -scores[best]  # ascending
    close = np.flatnonzero(np.diff(falling) <= TIE)  # where a tie may begin
    if close.size == 0:
        return best[:limit]  # no two within TIE: the order of the scores stands
    tie = np.arange(best.size)  # each its own, numbered by its place
    covered = 0
    for start in close.tolist():  # once per tie: few (copies of one text)
        if start >= covered:
            covered = int(np.searchsorted(falling, falling[start] + TIE, side="right"))
            tie[start:covered] = start
    ranked: np.ndarray = best[np.lexsort((table_rows(best), tie))][:limit]
    return ranked


def _contenders(scores: np.ndarray, margins: np.ndarray | float, limit: int) -> np.ndarray:
    """Which of `scores`, each known only to within its margin, can be among the best
    `limit` (ties within TIE included), ascending. At least `limit` true scores are at
    or above the floor (the limit-th highest of score - margin), so each of the best is,
    and its known score is at least the floor - margin."""
    if scores.size <= limit:
        return np.arange(scores.size)
    lows = scores - margins
    floor = np.partition(lows, scores.size - limit)[scores.size - limit]
    return np.flatnonzero(scores + margins >= floor - TIE)


_openmp: Any = None  # threadpoolctl's handle on torch's OpenMP, made on the first screen


def _one_torch_thread() -> AbstractContextManager[Any]:
    """torch on the calling thread alone while inside, as numpy's BLAS is
    (`one_blas_thread`). On two threads a screen is faster alone, but its OpenMP team must
    wait for a core that the other lane holds: at 8 clients the dense stage went from 6
    to 8.5 ms. OpenMP's limit is the calling thread's own and is given back on leaving
    (7 us), so nothing else on this thread or any other (torch embedding queries when
    ONNX is off, the worker's passages) loses its threads."""
    global _openmp
    import torch
    from threadpoolctl import ThreadpoolController

    if _openmp is None:
        _openmp = ThreadpoolController().select(user_api="openmp")
    torch.get_num_threads()  # torch's first-use set-up of a thread would undo the limit
    limited: AbstractContextManager[Any] = _openmp.limit(limits=1)
    return limited


def half_precision(matrix: np.ndarray, out: np.ndarray) -> np.ndarray:
    """`matrix` converted into `out` (float16, e.g. a file mapped for writing), a block
    at a time so that a mapped float32 matrix is never read whole into private memory."""
    import torch  # converts ten times faster than numpy, with the same rounding

    for start in range(0, len(matrix), COPY_BLOCK):
        block = np.asarray(matrix[start : start + COPY_BLOCK])
        torch.from_numpy(out[start : start + len(block)]).copy_(_as_tensor(block))
    return out


def _as_tensor(array: np.ndarray | None) -> Any:
    """A torch view of `array` (no copy), or None."""
    if array is None:
        return None
    import torch

    with warnings.catch_warnings():  # a read-only map: it is only read
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


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
