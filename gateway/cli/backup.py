"""`gateway backup DEST`: a copy of the data dir to restore from, made while servers run.

The catalog, the Tantivy directories and the LanceDB table versions name one another, so
a copy must be of one moment. The writer lock (the one ingest, delete, ACL changes,
reindex, erasure and the worker take) is held for the whole copy: no generation is written
meanwhile. Servers keep writing the catalog (audit records, replica reports, a key revoked),
so it is copied by SQLite's online backup, whole at one commit: `cp` of `catalog.db` and
then `catalog.db-wal`, with a checkpoint between the two, made a copy that had lost
committed changes (a key revoked before the copy worked again on it).
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Annotated, NamedTuple

import typer

from gateway.cli.options import (
    DataDirOption,
    fail,
    layout_of,
    settings_from_env,
    sqlite_file,
)
from gateway.storage.names import PARTIAL, generation_name

# The catalog's files: copied by SQLite's backup, never as files.
CATALOG_FILES = {"catalog.db", "catalog.db-wal", "catalog.db-shm", "catalog.db-journal"}
# Left out, and said so: a cache the server makes again (the query encoder's export), and
# the demo's credentials, which a production data dir does not hold.
LEFT_OUT = {
    "models": "models/ (a cache, made again at the next start)",
    "dev-issuer": "dev-issuer/ (the demo's credentials)",
    "demo.env": "demo.env (the demo's credentials)",
}
# Of these, only the served generation's directory: older ones are kept for servers still
# reading them (none reads them in a restored data dir), and anything else there is being
# written or removed (`g000042.partial`, `.g000041.removing-...`) or is a lock.
LEXICAL, FLAT = "lexical", "flat"
# Not copied from those directories: Tantivy's lock files (made again as Tantivy needs
# them; `snapshot_lexical` leaves them out too), and a file still being written, renamed
# into place when done (`half.npy.partial`: the restored server makes what is missing).
IN_FLIGHT = {".tantivy-writer.lock", ".tantivy-meta.lock"}


class Served(NamedTuple):
    number: int
    lexical_dir: str  # relative to the data dir, as the catalog names it


def backup(
    dest: Annotated[Path, typer.Argument(help="A new or empty directory, outside the data dir.")],
    data_dir: DataDirOption = None,
) -> None:
    """Copy the data dir to DEST while servers keep serving: a server started on DEST
    serves what the data dir held at one moment. For a SQLite catalog and an index in the
    data dir; writers wait until the copy is done."""
    settings = settings_from_env(data_dir)
    if settings.index_uri:
        fail(
            "backup: the index is in an object store (GATEWAY_INDEX_URI), which gateway "
            "backup cannot copy at one moment. With no writer running (gateway worker, and "
            "gateway serve's own writer), snapshot the store's prefix (bucket versioning or "
            "the store's own snapshot) and back up the catalog's database (pg_dump, or "
            "sqlite3's .backup); the data dir then holds only copies and caches."
        )
    layout = layout_of(settings)
    if not layout.catalog_url.startswith("sqlite"):
        fail(
            "backup: the catalog is in a database server (GATEWAY_DATABASE_URL), which "
            "gateway backup cannot copy. With no writer running (gateway worker, and gateway "
            "serve's own writer), dump the database (pg_dump) and copy the data dir's "
            "lexical/ and vectors/ with hard links kept (cp -a, tar, rsync -H)."
        )
    catalog = sqlite_file(layout.catalog_url)
    if catalog.resolve() != layout.catalog.resolve():
        fail(
            f"backup: the catalog ({catalog}, named by GATEWAY_DATABASE_URL) is outside the "
            f"data dir {layout.root}: copy it with sqlite3's .backup while no writer runs, "
            "or unset GATEWAY_DATABASE_URL to keep it in the data dir"
        )
    if not catalog.is_file():
        fail(f"backup: no catalog in {layout.root} (check --data-dir or GATEWAY_DATA_DIR)")
    root, target = layout.root.resolve(), dest.resolve()
    if target.is_relative_to(root):
        fail(f"backup: {dest} is inside the data dir {layout.root}: choose a place outside it")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        fail(f"backup: {dest} exists and is not an empty directory; nothing was copied")

    made = not target.exists()
    target.mkdir(parents=True, exist_ok=True)
    try:
        with layout.writer_lock():
            served = _copy_catalog(catalog, target / "catalog.db")
            _copy_index(root, target, served)
    except BaseException as exc:  # Ctrl-C too: no half copy is left to pass for a backup
        _discard(target, made)
        if isinstance(exc, sqlite3.Error):  # its message may quote the catalog: not shown
            fail(f"backup failed copying the catalog ({exc.sqlite_errorname}); {dest} removed")
        raise  # an OSError ends the command with its reason (`gateway.cli._Commands`)
    size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file() and not p.is_symlink())
    at = f"generation {served.number}" if served else "no generation yet"
    typer.echo(
        f"backed up {layout.root} to {dest}: {at}, {size} bytes; the catalog's copy passed "
        "SQLite's integrity check"
    )
    left_out = [said for name, said in LEFT_OUT.items() if (root / name).exists()]
    if left_out:
        typer.echo(f"left out: {', '.join(left_out)}")


def _copy_catalog(source: Path, target: Path) -> Served | None:
    """The catalog at one commit, checked by SQLite, and its served generation. The backup
    is one step, so one read transaction: servers go on writing (WAL does not block them),
    and none of their commits is half in the copy."""
    from gateway.storage.catalog import GENERATIONS

    live = sqlite3.connect(source, timeout=30)
    copy = sqlite3.connect(target)
    try:
        live.backup(copy)
        verdict = [row[0] for row in copy.execute("PRAGMA integrity_check")]
        newest = copy.execute(
            f"SELECT id, lexical_dir FROM {GENERATIONS} ORDER BY id DESC LIMIT 1"
        ).fetchone()
    finally:
        copy.close()
        live.close()
    if verdict != ["ok"]:
        fail(
            f"backup failed: the copy of the catalog fails SQLite's integrity check "
            f"({len(verdict)} problems); check the data dir's own: sqlite3 {source} "
            "'PRAGMA integrity_check'"
        )
    return Served(*newest) if newest else None


def _copy_index(root: Path, target: Path, served: Served | None) -> None:
    """Everything else a restore needs: the served generation's Tantivy directory and
    vector copy, the LanceDB tables, and whatever else the data dir holds but the catalog's
    files and what `LEFT_OUT` names. Under the writer lock, none of it changes meanwhile:
    servers remove only older generations, and write a vector copy whole or not at all."""
    for entry in sorted(root.iterdir()):
        if entry.name in CATALOG_FILES or entry.name in LEFT_OUT:
            continue
        if entry.name in (LEXICAL, FLAT):
            (target / entry.name).mkdir()
        elif entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, target / entry.name, symlinks=True)
        else:
            shutil.copy2(entry, target / entry.name, follow_symlinks=False)
    if served is None:
        return
    lexical = root / served.lexical_dir
    if not lexical.is_dir():
        fail(
            f"backup failed: generation {served.number}'s lexical index ({served.lexical_dir}) "
            "is missing from the data dir; restore it whole or run gateway reindex first"
        )
    shutil.copytree(lexical, target / served.lexical_dir, symlinks=True, ignore=_in_flight)
    vector_copy = Path(FLAT, generation_name(served.number))
    if (root / vector_copy).is_dir():  # else the restored server builds it
        shutil.copytree(root / vector_copy, target / vector_copy, symlinks=True, ignore=_in_flight)


def _in_flight(_directory: str, names: list[str]) -> set[str]:
    return {name for name in names if name in IN_FLIGHT or name.endswith(PARTIAL)}


def _discard(target: Path, made: bool) -> None:
    """What a failed backup wrote, and DEST itself if the backup made it."""
    if made:
        shutil.rmtree(target, ignore_errors=True)
        return
    for entry in target.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
