"""Erasure on a data dir with no index generation yet: a document pushed, deleted while its
job is still queued, then `gateway erase --wait` while another process holds the catalog
open (as `serve` does). Done means its text is in no file of the data dir, SQLite's WAL
file included (docs/security.md, "Erasure")."""

from __future__ import annotations

import functools
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from gateway.cli import app as cli
from gateway.ingest import erasure as erasure_module
from gateway.ingest.erasure import erase
from gateway.ingest.pipeline import delete_versions
from gateway.storage.catalog import Catalog
from gateway.storage.layout import DataLayout
from tests.helpers.canary import CANARY_WORDS, canary_doc, file_findings

CANARIES = [w.encode() for w in CANARY_WORDS]


def _queued_then_deleted(layout: DataLayout) -> Catalog:
    """A push of a canary and an ordinary document, queued (no writer ran), the canary then
    deleted: the calls `POST` and `DELETE /admin/documents` make. The catalog stays open,
    as a serving process's does."""
    held = layout.open_catalog()
    kept = {**canary_doc(9), "doc_id": "kept", "title": "Travel", "text": "Trains, not planes."}
    held.jobs.submit("acme", "test", [canary_doc(0), kept], 10)
    delete_versions(layout, "acme", "canary-0")
    with held.engine.connect() as connection:  # a pooled connection stays open
        connection.execute(text("SELECT 1"))
    return held


def _job_records(catalog: Catalog) -> Any:
    with catalog.engine.connect() as connection:
        return connection.execute(text("SELECT records_json FROM jobs")).scalars().all()


def test_erase_on_a_data_dir_with_no_generation_empties_the_wal(tmp_path: Path) -> None:
    layout = DataLayout(tmp_path / "data")
    held = _queued_then_deleted(layout)
    assert file_findings(layout.root, CANARIES)  # the scan sees it before

    result = CliRunner().invoke(
        cli, ["erase", "--tenant", "acme", "--wait", "--data-dir", str(layout.root)]
    )

    assert result.exit_code == 0, result.output
    assert result.output.startswith("erased (nothing indexed yet): ")  # no generation None
    assert held.erasures.open() == []
    assert file_findings(layout.root, CANARIES) == []
    assert [r for r in _job_records(held) if "kept" in r]  # the rest stays queued


@pytest.mark.sleeps  # the checkpoint waits the catalog's busy_timeout for the reader
def test_a_reader_that_keeps_the_wal_leaves_the_erasure_open_until_a_run_empties_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that could not empty the WAL is not done, and the next run (no slice left to
    clear then) empties it before marking the requests done."""
    layout = DataLayout(tmp_path / "data")
    held = _queued_then_deleted(layout)
    # One try a run, not 50: each waits the catalog's busy_timeout for the reader.
    once = functools.partial(erasure_module._empty_wal, tries=1)
    monkeypatch.setattr(erasure_module, "_empty_wal", once)
    reader = sqlite3.connect(layout.root / "catalog.db")
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM jobs").fetchone()  # a read transaction
        report = erase(layout, ann_min_rows=10_000)
        assert not report.done
        assert "WAL" in report.waiting_for[0]
        assert [r.status for r in held.erasures.open()] == ["pending"]
    finally:
        reader.close()

    assert erase(layout, ann_min_rows=10_000).done
    assert held.erasures.open() == []
    assert file_findings(layout.root, CANARIES) == []
