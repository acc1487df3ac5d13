"""`gateway sync` checks what it will send with the server's own rules before sending
anything, against `gateway serve` with its writer.

Sync read the folder as `gateway ingest` does, which allows what the push API refuses (a
doc_id over 512 characters, a title over 2,000, a principal that is not printable ASCII):
earlier batches were sent, the run stopped at the refused one, and the ACL changes planned
after the upserts, narrowing ones included, were skipped. Now such a file refuses the run
before any request, naming the file and the field; a file naming another tenant than the
key's stops the run at the first request, with nothing changed; and when the server
refuses a batch for a rule only it knows, the ACL changes and deletes are made anyway."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from subprocess import CompletedProcess

import httpx
import pytest

from gateway.embedding import Embedder
from gateway.storage.layout import DataLayout
from tests.helpers.documents import write_doc
from tests.helpers.identity import bearer
from tests.helpers.processes import gateway_env, run_gateway
from tests.helpers.sync import sync_server

pytestmark = pytest.mark.server

META = {"tenant": "acme", "region": "EU", "effective_from": "2020-01-01"}
STAFF = {**META, "acl": ["group:staff"]}


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, embedder: Embedder, jwks_file: Path
) -> Iterator[tuple[str, DataLayout, Path]]:
    with sync_server(tmp_path_factory.mktemp("sync-validation"), embedder, jwks_file) as served:
        yield served


def run_sync(base: str, key_file: Path, folder: Path, *extra: str) -> CompletedProcess[str]:
    env = gateway_env(XDG_STATE_HOME=str(folder.parent / "state"))
    return run_gateway(
        "sync", str(folder), "--url", base, "--key-file", str(key_file), *extra, env=env
    )


def refused(result: CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr


def acl_of(layout: DataLayout, doc_id: str) -> list[str] | None:
    row = layout.open_catalog().document("acme", doc_id, "1")
    return None if row is None else list(row.visibility.acl)


def first_run(base: str, key_file: Path, folder: Path) -> None:
    """Push `<prefix>-narrow` (staff) and `<prefix>-gone`; then narrow the first's ACL
    and remove the second's file: the next run has an ACL change and a delete to make."""
    prefix = folder.parent.name[-12:]
    write_doc(folder, "narrow.md", {"doc_id": f"{prefix}-narrow", **STAFF}, "Narrowed NRW-1.")
    write_doc(folder, "gone.md", {"doc_id": f"{prefix}-gone", **STAFF}, "Removed GNE-1.")
    result = run_sync(base, key_file, folder)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "2 sent, 0 ACL changes, 0 deleted, 0 unchanged"
    narrowed = {"doc_id": f"{prefix}-narrow", **META, "acl": ["group:risk"]}
    write_doc(folder, "narrow.md", narrowed, "Narrowed NRW-1.")
    (folder / "gone.md").unlink()


def test_files_the_server_would_refuse_stop_the_run_before_anything_is_sent(
    server: tuple[str, DataLayout, Path], tmp_path: Path
) -> None:
    base, layout, key_file = server
    jobs = layout.open_catalog().jobs
    folder = tmp_path / "share"
    first_run(base, key_file, folder)
    prefix = tmp_path.name[-12:]
    untenanted = {k: v for k, v in STAFF.items() if k != "tenant"}
    write_doc(folder, "fine.md", {"doc_id": f"{prefix}-fine", **untenanted}, "Fine FIN-1.")
    long_id = {"doc_id": "d" * 600, **STAFF}
    write_doc(folder, "long-id.md", long_id, "A long doc_id.")
    heading = {"doc_id": f"{prefix}-heading", **STAFF}  # its title: the first heading
    write_doc(folder, "heading.md", heading, "# " + "T" * 2500 + "\nBody HDG-1.")
    # Any script is a name: the server takes it, as `gateway ingest` does.
    accented = {"doc_id": f"{prefix}-accented", **META, "acl": ["group:équipe-rh"]}
    write_doc(folder, "accented.md", accented, "Accented ACC-1.")
    other = {"doc_id": f"{prefix}-other", **STAFF, "tenant": "globex"}
    write_doc(folder, "other.md", other, "Another tenant OTH-1.")
    before = jobs.counts()

    for extra in ((), ("--dry-run",)):
        stderr = refused(run_sync(base, key_file, folder, *extra))
        assert "refused, nothing was sent" in stderr
        for name, field in (
            ("long-id.md", "doc_id"),
            ("heading.md", "title"),
            ("long-id.md", "tenant"),  # names acme, the other file globex
            ("other.md", "tenant"),
        ):
            assert f"{folder / name}: {field}: " in stderr, (name, stderr)
        assert "fine.md" not in stderr and "T" * 100 not in stderr, stderr
        assert f"{folder / 'accented.md'}: acl" not in stderr, stderr
    assert jobs.counts() == before  # nothing was sent
    assert acl_of(layout, f"{prefix}-narrow") == ["group:staff"]
    assert acl_of(layout, f"{prefix}-gone") == ["group:staff"]

    # The server refuses exactly these, by the same rules.
    key = bearer(key_file.read_text().strip())
    for meta, field in ((long_id, "doc_id"),):
        record = {**meta, "text": "x"}
        answer = httpx.post(f"{base}/admin/documents", json={"documents": [record]}, headers=key)
        assert answer.status_code == 422, answer.text
        assert [e["field"] for e in answer.json()["errors"]] == [field]
    record = {**heading, "title": "T" * 2500, "text": "x"}
    answer = httpx.post(f"{base}/admin/documents", json={"documents": [record]}, headers=key)
    assert [e["field"] for e in answer.json()["errors"]] == ["title"]


def test_a_file_naming_another_tenant_stops_the_run_with_nothing_changed(
    server: tuple[str, DataLayout, Path], tmp_path: Path
) -> None:
    """Which tenant is the key's, only the server knows: the documents naming one go in
    the first request, before any other step, and its 403 `tenant_mismatch` stops the
    run. Before, the deletes still went, and the files were not named."""
    base, layout, key_file = server
    jobs = layout.open_catalog().jobs
    folder = tmp_path / "share"
    first_run(base, key_file, folder)
    prefix = tmp_path.name[-12:]
    untenanted = {k: v for k, v in STAFF.items() if k != "tenant"}
    for n in range(3):  # naming no tenant: sent after the one naming globex
        write_doc(folder, f"a{n}.md", {"doc_id": f"{prefix}-a{n}", **untenanted}, "Plain.")
    other = {"doc_id": f"{prefix}-other", **STAFF, "tenant": "globex"}
    write_doc(folder, "z-other.md", other, "Another tenant OTH-2.")
    before = jobs.counts()

    stderr = refused(run_sync(base, key_file, folder, "--batch-size", "2"))

    assert jobs.counts() == before
    assert acl_of(layout, f"{prefix}-narrow") == ["group:staff"]
    assert acl_of(layout, f"{prefix}-gone") == ["group:staff"]
    assert acl_of(layout, f"{prefix}-a0") is None
    assert f"{folder / 'z-other.md'}: tenant: globex is not the key's tenant" in stderr
    assert "nothing was queued or changed" in stderr


def test_acl_changes_and_deletes_go_when_the_server_refuses_a_batch(
    server: tuple[str, DataLayout, Path], tmp_path: Path
) -> None:
    """A rule only the server knows: `public` was written by `gateway ingest`, not by the
    key (403 not_owner). The narrowed ACL was skipped then; now it is made, the removed
    file's document deleted, and the message says what was done."""
    base, layout, key_file = server
    folder = tmp_path / "share"
    first_run(base, key_file, folder)
    prefix = tmp_path.name[-12:]
    write_doc(folder, "public.md", {"doc_id": "public", **STAFF}, "Taken over PUB-1.")
    assert acl_of(layout, "public") == ["group:staff"]

    stderr = refused(run_sync(base, key_file, folder))

    assert acl_of(layout, f"{prefix}-narrow") == ["group:risk"]
    assert acl_of(layout, f"{prefix}-gone") is None
    assert acl_of(layout, "public") == ["group:staff"]  # not the key's: untouched
    assert "403 documents ['public'] have versions this key did not push" in stderr
    assert "done before stopping: 0 sent, 1 ACL changes, 1 deleted" in stderr
