"""Making a generation ready for its first searches (`GATEWAY_WARM_INDEX`): at startup,
before `/readyz` says ready, and each newer generation as soon as it is served, in the
background (a change must be visible to the very next request, so none waits for this).

Why: readiness promises that the first query meets its budgets, and the
indexes are memory-mapped and opened lazily, so opening a generation reads almost
nothing. Measured on the 1M bench (two vCPUs, 2026-11-28): the first search after a start
took about 200 ms with every file in the page cache and 400-540 ms with none (its dense
lane then past its budget: `degraded`). Where it went: BM25 opening the tenant's
partitions (0.15 s of it reading a million row names), torch's first half-precision
product in the process (0.12-0.15 s), and the dense lane reading its mapped vectors page
by page. Pages the disk wrote stay slow even once mapped until a CPU has read them (0.13
s of a first exact search on this VM, without a single page fault: the hypervisor's).

What is done, in the order a search needs it, until the next file would take more than
half the memory the kernel (or the container's cgroup) says is available (a copy that
big would push out what the searches need as fast as it is read):
1. the generation's Tantivy files, and its vector copy's rows (their ACLs, which a dense
   search filters by), are read into the page cache;
2. the vector copy's own mappings (the half-precision screen every dense search reads for
   the caller's rows, then the full vectors it rescores a few hundred of) are populated
   (`MADV_POPULATE_READ`, Linux 5.14) and a word of each page read;
3. the partitions are opened: every one at startup; for a newer generation, those the
   one before had opened (the tenants this process has served);
4. one exact search of the vector copy is made, over as many rows as it takes to screen
   them, for torch's first product.
The LanceDB table is not read: only the approximate search of a universe over
`flat_search_max_rows` opens it.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gateway.storage.flat import SCREEN_FROM, FlatVectors
from gateway.storage.flatfile import copy_directory
from gateway.storage.layout import DataLayout, ServedIndex

log = logging.getLogger("gateway.storage")
SHARE_OF_AVAILABLE = 0.5
BLOCK = 8 << 20  # bytes read at a time: large enough for the disk, small in memory
MADV_POPULATE_READ = 22  # Linux 5.14; Python 3.11's mmap module does not name it


@dataclass(frozen=True)
class Warmed:
    files: int  # files read and mappings populated
    read_bytes: int
    left_bytes: int  # past the memory budget, not read
    partitions: int
    seconds: float


def warm_index(
    layout: DataLayout,
    served: ServedIndex,
    partitions: Sequence[str] | None = None,
    when: str = "at startup",
) -> Warmed:
    """Warm `served` within the memory budget, opening `partitions` (None: all); logs it."""
    started = time.monotonic()
    budget = available_bytes()
    if budget is not None:
        budget = int(budget * SHARE_OF_AVAILABLE)
    files, read, left = read_through(_sources(layout, served), budget)
    opened = served.lexical.open_partitions(partitions)
    _search_once(served.flat)
    warmed = Warmed(files, read, left, len(opened), time.monotonic() - started)
    log.info(
        "warmed index generation %d %s: %d files, %d MB, %d partitions in %.2f s%s",
        served.number,
        when,
        warmed.files,
        warmed.read_bytes >> 20,
        warmed.partitions,
        warmed.seconds,
        f"; {warmed.left_bytes >> 20} MB left unread, over half the available memory"
        if warmed.left_bytes
        else "",
    )
    return warmed


def index_files(layout: DataLayout, served: ServedIndex) -> list[Path]:
    """The files of the generation a search reads through the page cache: its Tantivy
    files, each partition's in turn, then its vector copy's but for the mapped arrays."""
    copy = copy_directory(layout.flat_root, served.number)
    return [
        *sorted(_regular_files(served.lexical.path)),
        *sorted(p for p in _regular_files(copy) if p.suffix != ".npy"),
    ]


Source = Path | np.ndarray  # a file to read, or a mapping of the vector copy to populate


def read_through(sources: Iterable[Source], budget: int | None) -> tuple[int, int, int]:
    """Read each file whole, or populate each mapping, in order; one that would take the
    total past `budget` bytes (None: no limit), and every one after it, is left: those
    after it are needed later in a search, not less. A file removed meanwhile (a pruned
    generation) is passed over. Returns (files and mappings, bytes read, bytes left)."""
    buffer = bytearray(BLOCK)
    done = read = left = 0
    for source in sources:
        try:
            size = source.nbytes if isinstance(source, np.ndarray) else source.stat().st_size
            if left or (budget is not None and read + size > budget):
                left += size
                continue
            read += _populate(source) if isinstance(source, np.ndarray) else _read(source, buffer)
        except FileNotFoundError:
            continue
        done += 1
    return done, read, left


def available_bytes(
    meminfo: Path = Path("/proc/meminfo"), cgroup: Path | None = None
) -> int | None:
    """Memory the kernel could give this process now: MemAvailable, or less where its
    cgroup (v2: a container's) has a limit; None where neither can be read (not Linux)."""
    found: list[int] = []
    cgroup = cgroup or _own_cgroup()
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)  # in kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            found.append(int(limit) - int((cgroup / "memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return max(0, min(found)) if found else None


def _sources(layout: DataLayout, served: ServedIndex) -> list[Source]:
    flat = served.flat
    mapped = [m for m in (flat.half, flat.matrix) if m is not None and _mapping(m) is not None]
    return [*index_files(layout, served), *mapped]


def _regular_files(directory: Path) -> Iterable[Path]:
    return (p for p in directory.rglob("*") if p.is_file() and not p.is_symlink())


def _search_once(flat: FlatVectors) -> None:
    if flat.size:
        vector = np.zeros(flat.matrix.shape[1], dtype=np.float32)
        vector[0] = 1.0
        flat.search(np.arange(min(flat.size, SCREEN_FROM)), vector, 1)


def _mapping(array: np.ndarray) -> mmap.mmap | None:
    """The mmap a numpy.memmap (or a view of one) reads from; None for memory of its own."""
    found = getattr(array, "_mmap", None)
    base = array.base
    while found is None and base is not None:
        found = base if isinstance(base, mmap.mmap) else getattr(base, "_mmap", None)
        base = getattr(base, "base", None)
    return found if isinstance(found, mmap.mmap) else None


def _populate(array: np.ndarray) -> int:
    mapping = _mapping(array)
    assert mapping is not None
    with contextlib.suppress(OSError, ValueError, AttributeError):  # older kernels: touched
        mapping.madvise(MADV_POPULATE_READ)  # maps every page at once, reading what is not in
    # Then a CPU reads a word of each: on a VM, pages the disk wrote are slow to a first
    # read even once mapped, and searches would pay that one page at a time.
    np.add.reduce(np.asarray(array).reshape(-1)[:: mmap.PAGESIZE // array.itemsize])
    return int(array.nbytes)


def _read(path: Path, buffer: bytearray) -> int:
    total = 0
    with open(path, "rb", buffering=0) as file:
        while chunk := file.readinto(buffer):
            total += chunk
    return total


def _own_cgroup() -> Path:
    """This process's cgroup (v2) directory: /proc/self/cgroup's "0::/path" line."""
    root = Path("/sys/fs/cgroup")
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return root / line[3:].lstrip("/")
    except OSError:
        pass
    return root
