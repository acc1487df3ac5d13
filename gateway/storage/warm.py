"""Making a generation ready for its first searches (`GATEWAY_WARM_INDEX`): the first one
before `/readyz` says ready, each newer one in the background once it is served (a
change must be visible to the very next request, so none waits for this).

Why: readiness promises that the first query meets its budgets, and the indexes are
memory-mapped and opened lazily, so opening a generation reads almost nothing. Measured
on the 1M bench (two vCPUs, 2026-11-28): the first search after a start took about 200 ms
with every file in the page cache and 380-540 ms with none (its dense lane then past its
budget: `degraded`). Where it went: BM25 opening the tenant's partitions (0.15 s of it
reading a million row names), torch's first half-precision product in the process
(0.12-0.15 s), and the dense lane reading its mapped vectors page by page. Pages the disk
wrote stay slow even once mapped until a CPU has read them (0.13 s of a first exact
search on this VM, without a single page fault: the hypervisor's).

What is done, in the order a search needs it, each step best-effort (what fails is left
to the searches, as without warming):
1. the partitions are opened: at startup every chunk partition and every document
   partition in step with its chunks; for a newer generation, those the generations
   before had opened (the tenants this process has served);
2. the generation's Tantivy files, chunk partitions first, and its vector copy's rows
   (their ACLs, which a dense search filters by) are read into the page cache;
3. the vector copy's own mappings (the half-precision screen every dense search reads for
   the caller's rows, then the full vectors it rescores a few hundred of) are populated
   (`MADV_POPULATE_READ`, Linux 5.14) and a byte of each page read, 2 MB at a time
   (madvise holds the GIL: the event loop and the lanes run between slices);
4. one exact search of the vector copy is made, over as many rows as it takes to screen
   them, for torch's first product;
5. where the policy ranks documents by a vector of each (`retrieval.document_vector`),
   and every file was read within the budget, the vector copy's documents are made
   (their chunks' sums: 2.2-4.1 s at 1M, which the first search by document would spend
   past its dense budget). A policy reloaded to ask for them has them made by the
   watcher, in the background (`ServedIndexes.watch`).
Steps 2 and 3 stop before the file that would take more than half the memory the kernel
says is available (or the container's cgroup v2 limit, less its reclaimable page cache):
a copy that big would push out what the searches need as fast as it is read. The LanceDB
table is not read: only the approximate search of a universe over `flat_search_max_rows`
opens it.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gateway.storage.flat import SCREEN_FROM, FlatVectors
from gateway.storage.flatfile import copy_directory
from gateway.storage.layout import DataLayout, ServedIndex, files_under
from gateway.storage.partitions import chunks_first

log = logging.getLogger("gateway.storage")
SHARE_OF_AVAILABLE = 0.5
BLOCK = 8 << 20  # bytes read at a time: large enough for the disk, small in memory
SLICE = 2 << 20  # bytes of a mapping populated at a time: madvise holds the GIL
MADV_POPULATE_READ = 22  # Linux 5.14; Python 3.11's mmap module does not name it

KeepGoing = Callable[[], bool]


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
    partitions: Iterable[str] | None = None,
    when: str = "at startup",
    keep_going: KeepGoing = lambda: True,
    previous: ServedIndex | None = None,
    documents: bool = False,
) -> Warmed | None:
    """Warm `served` within the memory budget, opening `partitions` (None: all; the row
    names `previous` already holds are taken from it), and with `documents` making its
    vector copy's documents (`FlatVectors.documents`), while `keep_going()`; logs what
    it did. None when it stopped on an error, logged too: warming is never a reason not
    to serve, and the searches read what is left."""
    started = time.monotonic()
    try:
        before = previous.lexical if previous is not None else None
        opened = served.lexical.open_partitions(partitions, keep_going, before)
        budget = available_bytes()
        if budget is not None:
            budget = int(budget * SHARE_OF_AVAILABLE)
        files, read, left = read_through(_sources(layout, served), budget, keep_going)
        if keep_going():
            _search_once(served.flat)
        if documents and not left and keep_going():
            # The policy ranks documents by vector: at 1M their sums took 2.2-4.1 s, in
            # the first search by document of each generation, past its dense budget.
            # Not past the budget: they read every vector. Once begun, not interrupted.
            served.flat.documents()
        finished = keep_going()
    except Exception as exc:
        log.warning(
            "warming index generation %d %s stopped (%s); the searches read what is left",
            served.number,
            when,
            type(exc).__name__,
        )
        return None
    warmed = Warmed(files, read, left, len(opened), time.monotonic() - started)
    log.info(
        "%s index generation %d %s: %d partitions opened, %d files and mappings, "
        "%d MB read, %d MB left unread (over half the available memory), in %.2f s",
        "warmed" if finished else "stopped warming (superseded, or stopping)",
        served.number,
        when,
        warmed.partitions,
        warmed.files,
        warmed.read_bytes >> 20,
        warmed.left_bytes >> 20,
        warmed.seconds,
    )
    return warmed


def index_files(layout: DataLayout, served: ServedIndex) -> list[Path]:
    """The files of the generation a search reads through the page cache: its Tantivy
    files, chunk partitions first, then its vector copy's but for the mapped arrays."""
    lexical = served.lexical.path
    copy = copy_directory(layout.flat_root, served.number)
    return [
        *sorted(files_under([lexical]), key=lambda p: chunks_first(str(p.relative_to(lexical)))),
        *sorted(p for p in files_under([copy]) if p.suffix != ".npy"),
    ]


Source = Path | np.ndarray  # a file to read, or a mapping of the vector copy to populate


def read_through(
    sources: Iterable[Source], budget: int | None, keep_going: KeepGoing = lambda: True
) -> tuple[int, int, int]:
    """Read each file whole, or populate each mapping, in order; one that would take the
    total past `budget` bytes (None: no limit), and every one after it, is left: those
    after it are needed later in a search, not less. A file that cannot be read (removed
    with a pruned generation meanwhile) is passed over. Returns (files and mappings,
    bytes read, bytes left)."""
    buffer = bytearray(BLOCK)
    done = read = left = 0
    for source in sources:
        if not keep_going():
            break
        try:
            if isinstance(source, Path):
                mapping, size = None, source.stat().st_size
            else:
                mapping = _mapping(source)
                size = len(mapping) if mapping is not None else 0
            if left or (budget is not None and read + size > budget):
                left += size
                continue
            if isinstance(source, Path):
                read += _read(source, buffer, keep_going)
            elif mapping is not None:
                read += _populate(mapping, keep_going)
        except OSError:
            continue
        done += 1
    return done, read, left


def available_bytes(
    meminfo: Path = Path("/proc/meminfo"), cgroup: Path | None = None
) -> int | None:
    """Memory the kernel could give this process now: MemAvailable, or less where its
    cgroup (v2: a container's) or one above it has a limit; None where neither can be
    read (not Linux). Within a cgroup, inactive page cache counts as free: the kernel
    takes it back first when the limit is reached."""
    found: list[int] = []
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)  # in kB
    except (OSError, ValueError, IndexError):
        pass
    own = cgroup or _own_cgroup()
    for group in (own, *own.parents):
        try:
            limit = (group / "memory.max").read_text().strip()
            if limit == "max":
                continue
            used = int((group / "memory.current").read_text())
            stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
            found.append(int(limit) - used + int(stat.get("inactive_file", 0)))
        except (OSError, ValueError):
            continue
    return max(0, min(found)) if found else None


def _sources(layout: DataLayout, served: ServedIndex) -> list[Source]:
    flat = served.flat
    mapped = [m for m in (flat.half, flat.matrix) if m is not None and _mapping(m) is not None]
    return [*index_files(layout, served), *mapped]


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


def _populate(mapping: mmap.mmap, keep_going: KeepGoing) -> int:
    """Map every page of `mapping` (reading what is not in the page cache), then read a
    byte of each: on a VM, pages the disk wrote are slow to a first read even once mapped,
    and searches would pay for that one page at a time."""
    pages = np.frombuffer(mapping, dtype=np.uint8)
    for start in range(0, len(mapping), SLICE):
        if not keep_going():
            break
        length = min(SLICE, len(mapping) - start)
        with contextlib.suppress(OSError, ValueError):  # an older kernel: read below
            mapping.madvise(MADV_POPULATE_READ, start, length)
        pages[start : start + length : mmap.PAGESIZE].sum(dtype=np.uint64)
    return len(mapping)


def _read(path: Path, buffer: bytearray, keep_going: KeepGoing) -> int:
    total = 0
    with open(path, "rb", buffering=0) as file:
        while keep_going() and (chunk := file.readinto(buffer)):
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
