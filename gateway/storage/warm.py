"""Reading the served generation's files once before `/readyz` says ready
(`GATEWAY_WARM_INDEX`), so that the first searches after a start find them in memory.

Why: readiness promises that the first query meets its budgets (DESIGN.md), and the
indexes are memory-mapped, so opening them reads almost nothing. After a restart on a
cold page cache the first searches read them from disk instead: on the 1M bench (2.4 GB
of Tantivy partitions and vector copies) every search of a run right after the test
suite ran past its lanes' budgets, and with two abandoned calls per lane still reading,
the next searches were refused at once (503 `lanes_unavailable`).

What is read, in the order a search needs it: the generation's Tantivy partitions
(BM25 walks their postings), then its vector copy (the rows' ACLs, the half-precision
screen every dense search reads for the caller's rows, then the full vectors it rescores
a few hundred of), until the next file would take more than half the memory the kernel
(or the container's cgroup) says is available: a copy that big would push out what the
searches need as fast as it is read. The LanceDB table is not read: only the approximate
search of a universe over `flat_search_max_rows` opens it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gateway.storage.flatfile import READ_ORDER, copy_directory
from gateway.storage.layout import DataLayout, ServedIndex

log = logging.getLogger("gateway.storage")
SHARE_OF_AVAILABLE = 0.5
BLOCK = 8 << 20  # bytes read at a time: large enough for the disk, small in memory


@dataclass(frozen=True)
class Warmed:
    files: int
    read_bytes: int
    left_bytes: int  # in files past the memory budget, not read
    seconds: float


def index_files(layout: DataLayout, served: ServedIndex) -> list[Path]:
    """The generation's files a search reads, in the order it needs them."""
    lexical = sorted(_regular_files(served.lexical.path))
    copy = copy_directory(layout.flat_root, served.number)
    return lexical + sorted(_regular_files(copy), key=_vector_rank)


def warm_index(layout: DataLayout, served: ServedIndex) -> Warmed:
    """Read the served generation's files within the memory budget; logs what it did."""
    budget = available_bytes()
    if budget is not None:
        budget = int(budget * SHARE_OF_AVAILABLE)
    warmed = read_through(index_files(layout, served), budget)
    log.info(
        "warmed index generation %d: %d files, %d MB read in %.1f s%s",
        served.number,
        warmed.files,
        warmed.read_bytes >> 20,
        warmed.seconds,
        f"; {warmed.left_bytes >> 20} MB left unread, over half the available memory"
        if warmed.left_bytes
        else "",
    )
    return warmed


def read_through(paths: Iterable[Path], budget: int | None) -> Warmed:
    """Read each file whole, in order, into the page cache; a file that would take the
    total past `budget` bytes (None: no limit), and every file after it, is left unread:
    those after it are needed later in a search, not less. A file removed meanwhile (a
    pruned generation) is passed over."""
    started = time.monotonic()
    buffer = bytearray(BLOCK)
    files = read = left = 0
    for path in paths:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        if left or (budget is not None and read + size > budget):
            left += size
            continue
        try:
            read += _read_whole(path, buffer)
        except FileNotFoundError:
            continue
        files += 1
    return Warmed(files, read, left, time.monotonic() - started)


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


def _read_whole(path: Path, buffer: bytearray) -> int:
    total = 0
    with open(path, "rb", buffering=0) as file:
        while chunk := file.readinto(buffer):
            total += chunk
    return total


def _regular_files(directory: Path) -> Iterable[Path]:
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink():
            yield path


def _vector_rank(path: Path) -> tuple[int, str]:
    name = path.name
    return (READ_ORDER.index(name) if name in READ_ORDER else len(READ_ORDER), name)
