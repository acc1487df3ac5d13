"""The in-memory vector copy of a generation as files in the data dir, memory-mapped.

Building the copy reads every vector of the table: 5-7 s at a million chunks, at every
start. So whoever builds it first writes it here, `flat/g000123/`: the matrix as one
`.npy` file (mapped read-only, never read into private memory) and the rest in an Arrow
file, with a manifest naming the table version it copies. A restart, or a second server
process on the same host, maps the files instead of rebuilding: the processes share one
copy in the page cache. The directory is written under a temporary name and renamed, under
a lock, so a reader sees a whole copy or none and several processes build it once. Copies
of generations older than the one before the newest are removed (a process still mapping
one keeps it until it lets go).

Beside the matrix lies its half-precision twin, `half.npy`, which screening reads
(`gateway/storage/flat.py`): mapped too, so the processes share it and only the pages of
the rows a search screens are ever read. A copy written before it existed gets it added,
under the same lock, the first time it is loaded to serve.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from gateway.storage import flat as flat_module
from gateway.storage.flat import Clustered, FlatVectors
from gateway.storage.names import PARTIAL, generation_name, generation_number
from gateway.storage.vectors import Snapshot

log = logging.getLogger("gateway.storage")
FORMAT = 1
MATRIX = "matrix.npy"
HALF = "half.npy"
COLUMNS = "rows.arrow"
MANIFEST = "manifest.json"
KEEP = 2  # the newest copy and the one before it


def copy_directory(root: Path, number: int) -> Path:
    """Where generation `number`'s copy is, or will be, under `root`."""
    return root / generation_name(number)


def open_flat(
    root: Path,
    number: int,
    key: dict[str, Any],
    snapshot: Callable[[], Snapshot],
    base: FlatVectors | None,
) -> FlatVectors:
    """Generation `number`'s copy: mapped from `root` when a whole copy of the table
    version `key` names is there, else built first from `snapshot()` (and `base`, or an
    older copy of the same table, where it can). The table is read only to build."""
    directory = copy_directory(root, number)
    wanted = {"format": FORMAT, **key}
    if _key(directory) == wanted and _has_half(directory):  # whole: no lock needed
        with contextlib.suppress(OSError, RuntimeError, ValueError):  # pruned meanwhile, or
            return load(directory)  # a twin to mend: see below
    with _locked(root):  # loaded under the lock: no builder prunes it meanwhile
        if _key(directory) != wanted:
            _build(root, number, wanted, snapshot, base)
        elif not _has_half(directory):
            _add_half(directory)
        try:
            return load(directory)
        except (OSError, RuntimeError, ValueError) as exc:
            if not (directory / HALF).exists():
                raise
            # A twin that does not fit its matrix (torn by a crash after its rename) is
            # made again, rather than refusing every start; it is derived data.
            log.warning("%s in %s unusable (%s); made again", HALF, directory.name, exc)
            (directory / HALF).unlink()
            _add_half(directory)
            return load(directory)


def build_flat(
    root: Path, number: int, key: dict[str, Any], snapshot: Callable[[], Snapshot]
) -> None:
    """For a writer, before it commits generation `number`: build its copy of the table
    version `key` names, replacing whatever copy has that number. One a crashed attempt
    left may name the same table and version with other rows: a table dropped and made
    again (an erasure's) starts its versions again."""
    with _locked(root):
        _build(root, number, {"format": FORMAT, **key}, snapshot, None)


def _build(
    root: Path,
    number: int,
    wanted: dict[str, Any],
    snapshot: Callable[[], Snapshot],
    base: FlatVectors | None,
) -> None:
    directory = copy_directory(root, number)
    base = base or _newest_below(root, number, wanted)
    partial = directory.with_name(directory.name + PARTIAL)
    shutil.rmtree(partial, ignore_errors=True)  # a crashed builder's
    partial.mkdir(parents=True)
    # The twin is written from the mapped matrix, not made in private memory first.
    flat = FlatVectors.build(snapshot(), base, _matrix_file(partial / MATRIX), screen=False)
    if flat_module.keeps_half(flat.size):
        _write_half(flat.matrix, partial / HALF)
    _save(flat, partial, wanted)
    shutil.rmtree(directory, ignore_errors=True)  # another table's, or another format's
    partial.rename(directory)
    _prune(root, number)


def load(directory: Path, screen: bool = True) -> FlatVectors:
    """The copy in `directory`, mapped; `screen` false for one only read to build another."""
    manifest = _manifest(directory)
    if manifest is None:
        raise RuntimeError(f"no vector copy in {directory}")
    matrix = np.load(directory / MATRIX, mmap_mode="r") if manifest["rows"] else None
    with pa.memory_map(str(directory / COLUMNS)) as source:
        table = pa.ipc.open_file(source).read_all()
    column = {name: table.column(name).combine_chunks() for name in table.column_names}
    rows = Clustered(
        chunk_ids=column["chunk_id"],
        addresses=column["address"].to_numpy(),
        table_row=column["table_row"].to_numpy(),
        tenant=column["tenant"].to_numpy(),
        region=column["region"].to_numpy(),
        starts=column["starts"].to_numpy(),
        ends=column["ends"].to_numpy(),
        acl=column["acl"],
        tenants=manifest["tenants"],
        regions=manifest["regions"],
    )
    if matrix is None:
        matrix = np.empty((0, manifest["dim"]), dtype=np.float32)
    mapped = screen and (directory / HALF).exists()
    half = np.load(directory / HALF, mmap_mode="r") if mapped else None
    return FlatVectors(rows, matrix, half, screen)


def _save(flat: FlatVectors, directory: Path, manifest: dict[str, Any]) -> None:
    rows = flat.rows
    table = pa.table(
        {
            "chunk_id": rows.chunk_ids,
            "address": pa.array(rows.addresses, pa.uint64()),
            "table_row": pa.array(rows.table_row, pa.int64()),
            "tenant": pa.array(rows.tenant, pa.int32()),
            "region": pa.array(rows.region, pa.int32()),
            "starts": pa.array(rows.starts, pa.int32()),
            "ends": pa.array(rows.ends, pa.int32()),
            "acl": rows.acl,
        }
    )
    with (
        pa.OSFile(str(directory / COLUMNS), "wb") as sink,
        pa.ipc.new_file(sink, table.schema) as writer,
    ):
        writer.write_table(table)
    if isinstance(flat.matrix, np.memmap):
        flat.matrix.flush()
    manifest = {
        **manifest,
        "rows": flat.size,
        "dim": int(flat.matrix.shape[1]),
        "tenants": rows.tenants,
        "regions": rows.regions,
    }
    (directory / MANIFEST).write_text(json.dumps(manifest))  # last: the copy is whole


def _has_half(directory: Path) -> bool:
    """Whether the copy has its half-precision twin, or is too small to be screened."""
    manifest = _manifest(directory)
    small = manifest is not None and not flat_module.keeps_half(manifest["rows"])
    return small or (directory / HALF).exists()


def _add_half(directory: Path) -> None:
    """The half-precision twin of a copy written before it had one, renamed into place
    once whole, so a reader sees it whole or not at all."""
    partial = directory / f"{HALF}.partial"
    _write_half(np.load(directory / MATRIX, mmap_mode="r"), partial)
    partial.rename(directory / HALF)


def _write_half(matrix: np.ndarray, path: Path) -> None:
    """`matrix` in half precision as an .npy file, converted block by block."""
    half = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=matrix.shape)
    flat_module.half_precision(matrix, half)
    half.flush()


def _matrix_file(path: Path) -> Any:
    def allocate(rows: int, dim: int) -> np.ndarray:
        if rows == 0:  # nothing to map
            return np.empty((0, dim), dtype=np.float32)
        return np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, dim))

    return allocate


def _manifest(directory: Path) -> dict[str, Any] | None:
    try:
        manifest: dict[str, Any] = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest


def _key(directory: Path) -> dict[str, Any] | None:
    """What the copy in `directory` copies (format, table, version), if it is whole."""
    manifest = _manifest(directory)
    if manifest is None:
        return None
    return {k: v for k, v in manifest.items() if k not in ("rows", "dim", "tenants", "regions")}


def _newest_below(root: Path, number: int, wanted: dict[str, Any]) -> FlatVectors | None:
    """A whole copy of an older version of the same table, to build from (after a restart
    that missed a few generations)."""
    older = sorted(
        (n, entry)
        for entry in root.iterdir()
        if (n := generation_number(entry.name)) is not None and n < number
    )
    for _, entry in reversed(older):
        found = _key(entry) or {}
        if all(found.get(k) == v for k, v in wanted.items() if k != "vector_version"):
            return load(entry, screen=False)
    return None


def _prune(root: Path, number: int) -> None:
    for entry in root.iterdir():
        older = generation_number(entry.name, partial=True)
        if older is not None and older <= number - KEEP:
            shutil.rmtree(entry, ignore_errors=True)


@contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One builder of a copy at a time, across the processes of a host: a second one
    waits and then maps what the first wrote."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
