"""Copies of live data dirs."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path


def copy_data_dir(source: Path, target: Path) -> Path:
    """A copy of a data dir that this process may have open. Not `shutil.copytree` alone:
    opening and closing the live catalog's files from this process drops the POSIX locks
    SQLite holds on them, and a server process on the same dir may then checkpoint and
    delete the WAL under the open connections (SQLite's "how to corrupt", 2.2). The
    catalog goes through SQLite's backup API instead."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("catalog.db*"))
    live = sqlite3.connect(source / "catalog.db")
    copy = sqlite3.connect(target / "catalog.db")
    try:
        live.backup(copy)
    finally:
        copy.close()
        live.close()
    return target
