"""`gateway sync`, the reference connector, against `gateway serve` with its writer: a folder
of Markdown, HTML and PDF files with sidecars is mirrored into the key's tenant, reruns
send only the difference, an ACL-only change goes through the ACL route (and is enforced
on the next request), and a removed file is deleted."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path
from subprocess import CompletedProcess

import httpx
import pytest

from gateway.authn.apikeys import create_key
from gateway.connector.sync import state_path
from gateway.embedding import Embedder
from gateway.storage.layout import DataLayout
from tests.helpers.documents import minimal_pdf, write_doc
from tests.helpers.identity import TokenFactory, bearer
from tests.helpers.processes import gateway_env, run_gateway
from tests.helpers.sync import sync_server

pytestmark = pytest.mark.server

STAFF = {"sub": "sam", "groups": ["staff"]}  # acme EU staff
META = {"tenant": "acme", "region": "EU", "effective_from": "2020-01-01"}


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, embedder: Embedder, jwks_file: Path
) -> Iterator[tuple[str, DataLayout, Path]]:
    with sync_server(tmp_path_factory.mktemp("sync"), embedder, jwks_file) as served:
        yield served


def make_folder(folder: Path) -> Path:
    body = "# Travel\nEconomy class for flights under six hours (TRV-6)."
    write_doc(folder, "travel.md", {"doc_id": "travel", **META, "acl": ["group:staff"]}, body)
    html = "<html><head><title>Lockers</title></head><body><p>Lockers open at 7 (LCK-7).</p>"
    (folder / "lockers.html").write_text(html + "</body></html>")
    sidecar = {**META, "acl": ["group:staff"], "doc_id": "lockers"}
    (folder / "lockers.html.meta.yaml").write_text(json.dumps(sidecar))
    minimal_pdf(folder / "keys.pdf", ["Keys are counted daily under rule KEY-77."])
    (folder / "keys.pdf.meta.yaml").write_text(json.dumps({**META, "acl": ["group:staff"]}))
    return folder


def run_sync(base: str, key_file: Path, folder: Path, *extra: str) -> CompletedProcess[str]:
    """`gateway sync`, its state kept under FOLDER/../state (the user's state dir)."""
    env = gateway_env(XDG_STATE_HOME=str(folder.parent / "state"))
    return run_gateway(
        "sync", str(folder), "--url", base, "--key-file", str(key_file), *extra, env=env
    )


def sync(base: str, key_file: Path, folder: Path, *extra: str) -> str:
    result = run_sync(base, key_file, folder, *extra)
    assert result.returncode == 0, result.stderr
    return result.stdout


def found(base: str, token: str, query: str) -> set[str]:
    response = httpx.post(f"{base}/search", json={"query": query}, headers=bearer(token))
    assert response.status_code == 200, response.text
    return {r["doc_id"] for r in response.json()["results"]}


@pytest.mark.long
def test_a_folder_is_mirrored_including_acl_changes_and_deletions(
    server: tuple[str, DataLayout, Path], tmp_path: Path, make_token: TokenFactory
) -> None:
    base, layout, key_file = server
    jobs = layout.open_catalog().jobs
    folder = make_folder(tmp_path / "share")
    staff = make_token(**STAFF)

    plan = sync(base, key_file, folder, "--dry-run")
    assert "+ travel@1" in plan and "+ lockers@1" in plan and "+ keys@1" in plan
    assert plan.splitlines()[-1] == "3 to send, 0 ACL changes, 0 to delete, 0 unchanged"
    assert jobs.counts() == {} and not (folder / ".gateway-sync.json").exists()

    assert sync(base, key_file, folder).splitlines()[-1].startswith("3 sent")
    assert {"travel", "lockers", "keys"} <= found(base, staff, "TRV-6 LCK-7 KEY-77 rule")
    assert jobs.counts() == {"succeeded": 1}

    again = sync(base, key_file, folder)
    assert again.splitlines()[-1] == "0 sent, 0 ACL changes, 0 deleted, 3 unchanged"
    assert jobs.counts() == {"succeeded": 1}  # nothing was sent

    (folder / "lockers.html.meta.yaml").write_text(
        json.dumps({**META, "acl": ["group:facilities"], "doc_id": "lockers"})
    )
    write_doc(
        folder,
        "travel.md",
        {"doc_id": "travel", **META, "acl": ["group:staff"]},
        "# Travel\nBusiness class for flights over six hours (TRV-7).",
    )
    (folder / "keys.pdf").unlink()
    plan = sync(base, key_file, folder, "--dry-run")
    assert "~ lockers@1  acl group:facilities" in plan and "- keys@1" in plan
    summary = sync(base, key_file, folder).splitlines()[-1]
    assert summary == "1 sent, 1 ACL changes, 1 deleted, 0 unchanged"
    assert jobs.counts() == {"succeeded": 2}  # the ACL change and the delete were no jobs
    visible = found(base, staff, "TRV-7 LCK-7 KEY-77 rule")
    assert "travel" in visible and not {"lockers", "keys"} & visible
    document = httpx.get(f"{base}/documents/travel", headers=bearer(staff)).json()
    assert "TRV-7" in document["text"]


def test_a_refused_file_stops_the_sync_before_anything_is_sent(
    server: tuple[str, DataLayout, Path], tmp_path: Path
) -> None:
    base, layout, key_file = server
    folder = make_folder(tmp_path / "share")
    write_doc(folder, "broken.md", {"doc_id": "broken", **META}, "No ACL here.")
    before = layout.open_catalog().jobs.counts()
    result = run_gateway(
        "sync", str(folder), "--url", base, "--key-file", str(key_file), env=gateway_env()
    )
    assert result.returncode == 1
    assert "broken.md: acl" in result.stderr
    assert layout.open_catalog().jobs.counts() == before


def test_links_out_of_the_folder_are_never_read_nor_pushed(
    server: tuple[str, DataLayout, Path], tmp_path: Path, make_token: TokenFactory
) -> None:
    """A shared folder's writer links a private file, and the connector's own key file,
    into the folder, with sidecars that would make them documents: both are skipped and
    named, never read; the rest of the folder is mirrored."""
    base, layout, key_file = server
    private = tmp_path / "private" / "payroll.txt"
    private.parent.mkdir()
    private.write_text("Payroll rule PAY-991 applies to every salary.")
    private.chmod(0o600)
    folder = tmp_path / "share"
    write_doc(folder, "memo.md", {"doc_id": "memo-l", **META, "acl": ["group:staff"]}, "MEMO-5.")
    for name, target in (("notes.txt", private), ("key.txt", key_file)):
        (folder / name).symlink_to(target)
        sidecar = {**META, "acl": ["group:staff"], "doc_id": f"linked-{name[:-4]}"}
        (folder / f"{name}.meta.yaml").write_text(json.dumps(sidecar))
    secret = key_file.read_text().strip()

    plan = sync(base, key_file, folder, "--dry-run")
    assert f"! {folder / 'notes.txt'}  skipped" in plan and f"! {folder / 'key.txt'}" in plan
    assert plan.splitlines()[-1] == "1 to send, 0 ACL changes, 0 to delete, 0 unchanged"
    result = run_sync(base, key_file, folder)
    assert result.returncode == 0, result.stderr
    assert f"{folder / 'notes.txt'}  skipped" in result.stderr
    assert result.stdout.splitlines()[-1].startswith("1 sent")
    for said in (plan, result.stdout, result.stderr):
        assert "PAY-991" not in said and secret not in said
    catalog = layout.open_catalog()
    assert catalog.document("acme", "memo-l", "1") is not None
    assert catalog.document("acme", "linked-notes", "1") is None
    assert catalog.document("acme", "linked-key", "1") is None
    staff = make_token(**STAFF)
    assert "memo-l" in found(base, staff, "MEMO-5")
    assert not {"linked-notes", "linked-key"} & found(base, staff, "PAY-991 payroll salary gk")


def test_links_to_files_in_the_folder_are_named_as_gateway_ingest_names_them(
    server: tuple[str, DataLayout, Path], tmp_path: Path
) -> None:
    """A link to a file in the folder is passed over (the file is read where it lies,
    under its own name): `gateway ingest` named it on stderr, sync passed over it
    silently. Now sync names it too, in the plan and on stderr."""
    base, layout, key_file = server
    folder = tmp_path / "share"
    write_doc(folder, "memo.md", {"doc_id": "memo-in", **META, "acl": ["group:staff"]}, "M-8.")
    (folder / "alias.md").symlink_to(folder / "memo.md")
    said = f"! {folder / 'alias.md'}  skipped: a link to a file in the folder, read there"

    plan = sync(base, key_file, folder, "--dry-run")
    assert said in plan
    result = run_sync(base, key_file, folder)
    assert result.returncode == 0, result.stderr
    assert said in result.stderr
    assert result.stdout.splitlines()[-1].startswith("1 sent")
    catalog = layout.open_catalog()
    assert catalog.document("acme", "memo-in", "1") is not None
    assert catalog.document("acme", "alias", "1") is None


def test_a_document_too_large_for_a_request_is_named_and_the_rest_is_mirrored(
    server: tuple[str, DataLayout, Path], tmp_path: Path
) -> None:
    """Batches are cut to the request limit (the gateway's 32 MiB, or less with
    --max-request-bytes): each small document goes in a request of its own here, and the
    one over the limit alone is named with its size, never sent, and the run exits 1."""
    base, layout, key_file = server
    folder = tmp_path / "share"
    staff_meta = {**META, "acl": ["group:staff"]}
    for name in ("fit-a", "fit-b"):
        # a request of about 600 bytes: two do not fit in 1000
        write_doc(folder, f"{name}.md", {"doc_id": name, **staff_meta}, f"{name} FIT-1. " * 30)
    write_doc(folder, "huge.md", {"doc_id": "huge", **staff_meta}, "Huge HUGE-1. " * 300)
    jobs = layout.open_catalog().jobs
    before = sum(jobs.counts().values())

    result = run_sync(base, key_file, folder, "--max-request-bytes", "1000")

    assert result.returncode == 1
    assert f"! {folder / 'huge.md'}  not sent: huge@1 makes a request of " in result.stderr
    assert "over the limit of 1000 bytes" in result.stderr
    assert "1 documents not sent" in result.stderr and "HUGE-1" not in result.stderr
    assert result.stdout.splitlines()[-1].startswith("2 sent")
    assert sum(jobs.counts().values()) == before + 2  # one request each: both did not fit
    catalog = layout.open_catalog()
    assert catalog.document("acme", "fit-a", "1") is not None
    assert catalog.document("acme", "fit-b", "1") is not None
    assert catalog.document("acme", "huge", "1") is None


def test_a_sidecar_linked_out_of_the_folder_is_refused(
    server: tuple[str, DataLayout, Path], tmp_path: Path
) -> None:
    base, layout, key_file = server
    metadata = tmp_path / "private.yaml"
    metadata.write_text(json.dumps({**META, "acl": ["group:staff"], "doc_id": "sidecar-l"}))
    metadata.chmod(0o600)
    folder = tmp_path / "share"
    folder.mkdir()
    (folder / "note.txt").write_text("Lockers open at 7 (LCK-8).")
    (folder / "note.txt.meta.yaml").symlink_to(metadata)
    before = layout.open_catalog().jobs.counts()
    result = run_sync(base, key_file, folder)
    assert result.returncode == 1
    assert f"{folder / 'note.txt.meta.yaml'}: file: a link to a place outside" in result.stderr
    assert layout.open_catalog().jobs.counts() == before


def test_the_state_lives_outside_the_folder_and_a_forged_one_deletes_nothing(
    server: tuple[str, DataLayout, Path], tmp_path: Path
) -> None:
    """Before, `.gateway-sync.json` in the folder decided what was deleted: one line added
    to it deleted a document the connector never pushed. Now the state lives in the
    user's state dir (0600), a state file in the folder is taken over once and then
    ignored, and the server refuses a delete of what the key did not push."""
    base, layout, key_file = server
    catalog = layout.open_catalog()
    assert catalog.document("acme", "public", "1") is not None  # written by `gateway ingest`
    forged = {
        "format": 1,
        "url": base,
        "versions": [{"doc_id": "public", "version": "1", "content": "x", "acl": []}],
    }
    folder = tmp_path / "share"
    write_doc(folder, "memo.md", {"doc_id": "memo-s", **META, "acl": ["group:staff"]}, "MEMO-6.")
    assert sync(base, key_file, folder).splitlines()[-1].startswith("1 sent")
    assert not (folder / ".gateway-sync.json").exists()
    [state] = (tmp_path / "state" / "gateway-sync").iterdir()
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.parent.stat().st_mode) == 0o700

    (folder / ".gateway-sync.json").write_text(json.dumps(forged))  # ignored: state exists
    summary = sync(base, key_file, folder).splitlines()[-1]
    assert summary == "0 sent, 0 ACL changes, 0 deleted, 1 unchanged"
    assert catalog.document("acme", "public", "1") is not None

    # No state yet (a new machine, URL spelling or --state-dir): the folder's is taken over,
    # for the files in the folder only. Its entry for memo-s, a document this key pushed
    # (or was handed by `gateway keys adopt`) but absent here, is forgotten, never deleted.
    fresh = tmp_path / "fresh"
    write_doc(fresh, "memo.md", {"doc_id": "memo-f", **META, "acl": ["group:staff"]}, "MEMO-7.")
    planted = {**forged, "versions": [{**forged["versions"][0], "doc_id": "memo-s"}]}
    (fresh / ".gateway-sync.json").write_text(json.dumps(planted))
    result = run_sync(base, key_file, fresh)
    assert result.returncode == 0, result.stderr
    assert "took over" in result.stderr
    assert "1 versions in it whose files are not in the folder were forgotten" in result.stderr
    assert result.stdout.splitlines()[-1] == "1 sent, 0 ACL changes, 0 deleted, 0 unchanged"
    assert catalog.document("acme", "memo-s", "1") is not None
    assert not (fresh / ".gateway-sync.json").exists()  # taken over once: renamed
    assert (fresh / ".gateway-sync.json.taken-over").is_file()

    elsewhere = run_sync(base, key_file, fresh, "--state-dir", str(tmp_path / "other"))
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert "took over" not in elsewhere.stderr  # not a second time, even without a state
    assert elsewhere.stdout.splitlines()[-1] == "1 sent, 0 ACL changes, 0 deleted, 0 unchanged"
    assert catalog.document("acme", "memo-s", "1") is not None


def test_an_acl_change_the_server_cannot_make_stops_no_delete(
    server: tuple[str, DataLayout, Path], tmp_path: Path
) -> None:
    """A version deleted on the server since the last run (by an operator with the key,
    or the admin) cannot have its ACL changed: that was fatal, before the deletes, so a
    file removed at the source stayed readable run after run. Now it is reported and
    forgotten, and the deletes go on."""
    base, layout, key_file = server
    catalog = layout.open_catalog()
    folder = tmp_path / "share"
    for name in ("acl-a", "acl-b"):
        write_doc(folder, f"{name}.md", {"doc_id": name, **META, "acl": ["group:staff"]}, name)
    assert sync(base, key_file, folder).splitlines()[-1].startswith("2 sent")
    key = key_file.read_text().strip()
    gone = httpx.delete(f"{base}/admin/documents/acl-a", headers=bearer(key), timeout=30)
    assert gone.status_code in (200, 202), gone.text
    write_doc(folder, "acl-a.md", {"doc_id": "acl-a", **META, "acl": ["group:risk"]}, "acl-a")
    (folder / "acl-b.md").unlink()

    result = run_sync(base, key_file, folder)

    assert result.returncode == 0, result.stderr
    assert "ACL not changed: acl-a@1 gone (404)" in result.stderr
    assert result.stdout.splitlines()[-1] == "0 sent, 0 ACL changes, 1 deleted, 0 unchanged"
    assert catalog.document("acme", "acl-b", "1") is None


def test_a_documents_uri_is_its_path_in_the_folder_never_on_this_host(
    server: tuple[str, DataLayout, Path], tmp_path: Path, make_token: TokenFactory
) -> None:
    """The connector sent each file's absolute path as its uri (`/mnt/...`): every reader
    saw where the share is mounted on the connector's host. Now a document that names no
    uri gets its path in the folder, or that path under --uri-base; a named uri is kept."""
    base, layout, key_file = server
    folder = tmp_path / "mnt" / "share"
    staff_meta = {**META, "acl": ["group:staff"]}
    write_doc(folder / "policies", "leave.md", {"doc_id": "uri-leave", **staff_meta}, "LV-31.")
    named = {"doc_id": "uri-named", **staff_meta, "uri": "https://wiki.example.com/named"}
    write_doc(folder, "named.md", named, "Named NM-32.")
    assert sync(base, key_file, folder).splitlines()[-1].startswith("2 sent")

    catalog = layout.open_catalog()
    assert catalog.document("acme", "uri-leave", "1").uri == "policies/leave.md"  # type: ignore[union-attr]
    assert catalog.document("acme", "uri-named", "1").uri == named["uri"]  # type: ignore[union-attr]
    staff = bearer(make_token(**STAFF))
    shown = httpx.get(f"{base}/documents/uri-leave", headers=staff)
    assert shown.status_code == 200 and shown.json()["uri"] == "policies/leave.md"
    assert str(tmp_path) not in shown.text

    summary = sync(base, key_file, folder, "--uri-base", "https://files.example.com/hr/")
    assert summary.splitlines()[-1] == "1 sent, 0 ACL changes, 0 deleted, 1 unchanged"
    moved = catalog.document("acme", "uri-leave", "1")
    assert moved is not None and moved.uri == "https://files.example.com/hr/policies/leave.md"
    assert moved.doc_id == "uri-leave"  # the doc_id is the file name's, as before


def test_one_folder_mirrored_into_two_tenants_keeps_a_state_per_key(
    server: tuple[str, DataLayout, Path], tmp_path: Path, make_token: TokenFactory
) -> None:
    """The state was one per folder and URL: mirrored with a second tenant's key, the
    folder was "unchanged" (nothing sent), and a removed file's delete was spent on the
    tenant that did not have it, so the other kept serving it."""
    base, layout, acme_key_file = server
    globex_key, _ = create_key(
        layout.open_catalog(), tenant="globex", region="EU", principals=[], scope="ingest"
    )
    globex_key_file = tmp_path / "globex.key"
    globex_key_file.write_text(globex_key + "\n")
    folder = tmp_path / "share"
    meta = {"region": "EU", "effective_from": "2020-01-01", "acl": ["group:staff"]}
    write_doc(folder, "fares.md", {"doc_id": "fares-2t", **meta}, "Fares rule FAR-61 economy.")
    write_doc(folder, "desks.md", {"doc_id": "desks-2t", **meta}, "Desks rule DSK-72 open.")
    acme = make_token(sub="ann", tenant="acme", region="EU", groups=["staff"])
    globex = make_token(sub="ann", tenant="globex", region="EU", groups=["staff"])
    query = "FAR-61 DSK-72 rule"
    for key_file in (acme_key_file, globex_key_file):
        assert sync(base, key_file, folder).splitlines()[-1].startswith("2 sent"), key_file
    mirrored = {"fares-2t", "desks-2t"}
    assert mirrored <= found(base, acme, query) and mirrored <= found(base, globex, query)

    (folder / "desks.md").unlink()  # gone from the folder: from both tenants
    for key_file in (globex_key_file, acme_key_file):
        assert "1 deleted" in sync(base, key_file, folder).splitlines()[-1], key_file
    for token in (acme, globex):
        hits = found(base, token, query)
        assert "fares-2t" in hits and "desks-2t" not in hits


def test_the_state_an_earlier_release_kept_per_folder_is_taken_over_by_the_next_run(
    server: tuple[str, DataLayout, Path], tmp_path: Path
) -> None:
    """Without it, a file removed before the first run after the upgrade would never be
    deleted: the new state would not know it was sent."""
    base, layout, key_file = server
    folder = tmp_path / "share"
    write_doc(folder, "memo.md", {"doc_id": "memo-up", **META, "acl": ["group:staff"]}, "MEMO-9.")
    write_doc(folder, "kept.md", {"doc_id": "kept-up", **META, "acl": ["group:staff"]}, "KEPT-9.")
    assert sync(base, key_file, folder).splitlines()[-1].startswith("2 sent")
    states = tmp_path / "state" / "gateway-sync"
    [state] = states.iterdir()
    earlier = state_path(states, folder, base.rstrip("/"))  # as an earlier release named it
    state.rename(earlier)
    (folder / "memo.md").unlink()
    # A preview reads it, and leaves it for whichever key sends first.
    preview = run_sync(base, key_file, folder, "--dry-run")
    assert preview.returncode == 0, preview.stderr
    assert "1 to delete" in preview.stdout.splitlines()[-1] and "took over" not in preview.stderr
    assert earlier.is_file()
    result = run_sync(base, key_file, folder)
    assert result.returncode == 0, result.stderr
    assert "took over" in result.stderr
    assert "1 deleted" in result.stdout.splitlines()[-1]
    assert layout.open_catalog().document("acme", "memo-up", "1") is None
