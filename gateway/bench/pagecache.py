"""The page cache as the measurements and tests of a cold start see it (Linux): a data dir's
files pushed out of it, as after a reboot, and how much of a file is in it."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import numpy as np

from gateway.storage.layout import files_under

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
MAP_FAILED = ctypes.c_void_p(-1).value


def evict(root: Path) -> int:
    """Every regular file under `root` written to disk and dropped from the page cache
    (what no process maps: a mapped page stays); returns how many files. No privilege is
    needed, unlike /proc/sys/vm/drop_caches, and nothing outside `root` is touched."""
    count = 0
    for path in files_under([root]):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # removed meanwhile (a pruned generation)
            continue
        try:
            os.fsync(fd)  # a dirty page is not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        count += 1
    return count


def resident_bytes(path: Path) -> tuple[int, int]:
    """(bytes of the file in the page cache, its size), by mincore(2) on a fresh mapping:
    mapping it reads nothing."""
    size = path.stat().st_size
    if size == 0:
        return 0, 0
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed")
        try:
            pages = (size + page - 1) // page
            vector = ctypes.create_string_buffer(pages)
            if _libc.mincore(address, size, vector) != 0:
                raise OSError(ctypes.get_errno(), f"mincore of {path} failed")
            resident = int((np.frombuffer(vector.raw, dtype=np.uint8) & 1).sum())
        finally:
            _libc.munmap(address, size)
    finally:
        os.close(fd)
    return min(size, resident * page), size
