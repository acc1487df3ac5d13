"""Erasure on the embedded topology: after a delete and `erase`, the canary documents'
words are in no Tantivy index (document frequency, which counts documents only marked
deleted), no row of any version of any LanceDB table, and no byte of any file of the data
dir, while everything else still answers (docs/security.md, "Erasure")."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from sqlmodel import Session, select

from gateway.domain import version_key
from gateway.embedding import Embedder
from gateway.ingest import erasure as erasure_module
from gateway.ingest import tenants as tenants_module
from gateway.ingest.embedder import EmbedOnly
from gateway.ingest.erasure import erase
from gateway.ingest.pipeline import delete_versions, ingest_paths, set_acl
from gateway.ingest.tenants import delete_superseded, delete_tenant
from gateway.ingest.worker import IngestWorker
from gateway.policy.loader import load_policy
from gateway.policy.model import Policy
from gateway.restriction import Restriction
from gateway.storage.directory import Entry, UserFields
from gateway.storage.layout import DataLayout, open_served, remove_older_copies
from gateway.storage.replicas import Replicas
from gateway.storage.slices import SliceRow
from tests.helpers.canary import canary_doc, canary_vectors, file_findings, scan
from tests.helpers.documents import SQUAD_SLICE, TODAY, write_corpus, write_doc
from tests.helpers.policies import write_policy

ANN = 10_000  # no ANN index at this size


def _ingest_canaries(docs: Path, count: int, tenant: str = "acme") -> list[str]:
    ids = []
    for n in range(count):
        d = canary_doc(n)
        meta = {k: d[k] for k in ("doc_id", "version", "title", "region", "acl", "effective_from")}
        write_doc(docs, f"canary-{n}.md", {**meta, "tenant": tenant}, d["text"])
        ids.append(d["doc_id"])
    return ids


def _staff(tenant: str = "acme") -> Restriction:
    return Restriction(
        tenant=tenant, principals=frozenset({"group:staff"}), regions=frozenset({"EU"}), as_of=TODAY
    )


def _found(layout: DataLayout, embedder: Embedder, query: str) -> list[str]:
    """The chunks BM25 finds for acme's staff in the generation served now."""
    served = open_served(layout, layout.open_catalog(), embedder.name, embedder.dim)
    assert served is not None
    return [h.chunk_id for h in served.lexical.search(_staff(), query, 5)]


def test_a_deleted_document_is_gone_from_every_file_once_erased(
    tmp_path: Path, embedder: Embedder
) -> None:
    layout = DataLayout(tmp_path / "data")
    corpus = write_corpus(tmp_path / "corpus")
    ingest_paths([corpus], layout, embedder)
    canaries = tmp_path / "canaries"
    ids = _ingest_canaries(canaries, 3)
    ingest_paths([canaries], layout, embedder)
    set_acl(layout, "acme", "canary-0", ["group:staff", "group:risk"])  # one more generation
    vectors = canary_vectors(str(layout.vectors), None, ids)
    assert vectors
    for doc_id in ids:
        delete_versions(layout, "acme", doc_id)

    before = scan(layout.root, ids, vectors)
    assert before.tantivy and before.lance  # the scans see what a delete leaves

    report = erase(layout, ann_min_rows=ANN)
    assert report.done and report.generation is not None
    assert report.files_removed > 0
    after = scan(layout.root, ids, vectors)
    assert after.empty, after

    catalog = layout.open_catalog()
    served = open_served(layout, catalog, embedder.name, embedder.dim)
    assert served is not None and served.number == report.generation
    hits = served.lexical.search(_staff(), "refunds paid within days", 5)
    assert hits and all(not h.chunk_id.startswith("canary") for h in hits)
    dense = served.vectors.search(_staff(), embedder.embed_query("refund policy"), 5)
    assert dense and all(not h.chunk_id.startswith("canary") for h in dense)
    assert np.isfinite(served.flat.matrix).all()
    assert catalog.erasures.open() == []


def test_vectors_embedders_handed_over_for_a_document_deleted_from_its_job_are_erased(
    tmp_path: Path, embedder: Embedder
) -> None:
    """A document deleted while its job is queued, after a `gateway worker --embed-only`
    handed its vectors over: once `erase` reports done, its chunk vectors, sentence
    vectors and digests are in no file of the data dir (the catalog's included), and the
    job is still written whole without it."""
    layout = DataLayout(tmp_path / "data")
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    policy_dir = write_policy(tmp_path / "policy", ingest={"slice_chunks": 4})

    def policy() -> Policy:
        return load_policy(policy_dir).policy

    catalog = layout.open_catalog()
    others = [json.loads(line) for line in SQUAD_SLICE.read_text().splitlines()[:4]]
    records = [canary_doc(0)] + [
        {**canary_doc(9), "doc_id": p["_id"], "title": p["title"], "text": p["text"]}
        for p in others
    ]
    job = catalog.jobs.submit("acme", "test", records, 10)
    embed_only = EmbedOnly(catalog, embedder, policy, claim_timeout_s=60)
    while embed_only.run_once():
        pass
    victim = version_key("acme", "canary-0", "1") + ":"
    vectors: list[np.ndarray] = []
    wanted: list[bytes] = []  # its digests and sentence vectors, as stored
    with Session(catalog.engine) as s:
        for row in s.exec(select(SliceRow)).all():
            ids = json.loads(row.chunk_ids_json or "[]")
            sizes = json.loads(row.sentence_sizes_json or "[]")
            starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
            matrix = np.frombuffer(row.vectors or b"", dtype=np.float32).reshape(-1, embedder.dim)
            for n, chunk_id in enumerate(ids):
                if chunk_id.startswith(victim):
                    vectors.append(matrix[n].copy())
                    wanted.append((row.digests or b"")[n * 16 : (n + 1) * 16])
                    wanted.append((row.sentence_vectors or b"")[starts[n] : starts[n] + 48])
    assert vectors  # handed over before the delete
    delete_versions(layout, "acme", "canary-0")
    assert scan(layout.root, ["canary-0"], vectors).files  # the scan sees them

    report = erase(layout, ann_min_rows=ANN)
    assert report.done
    after = scan(layout.root, ["canary-0"], vectors)
    assert after.empty, after
    assert file_findings(layout.root, wanted) == []
    assert report.slices_cleared == 1

    writer = IngestWorker(layout, embedder, policy, claim_timeout_s=60)
    while writer.run_once():
        pass
    ended = catalog.jobs.job("acme", job.job_id)
    assert ended is not None and ended.status == "succeeded", ended and ended.errors
    assert catalog.document("acme", "canary-0", "1") is None
    written = [catalog.chunks_of("acme", p["_id"], "1") for p in others]
    assert all(written) and ended.chunks == sum(len(c) for c in written)


def test_a_partition_with_documents_only_marked_deleted_is_written_again(
    tmp_path: Path, embedder: Embedder
) -> None:
    """Tantivy keeps a deleted document's terms until a merge drops it; the erasure
    writes such a tenant's partitions again from the catalog, so its words are gone while
    the tenant's other documents stay searchable."""
    layout = DataLayout(tmp_path / "data")
    docs = tmp_path / "docs"
    ids = _ingest_canaries(docs, 1)
    meta = {
        "tenant": "acme",
        "region": "EU",
        "acl": ["group:staff"],
        "effective_from": "2020-01-01",
    }
    write_doc(docs, "keep.md", {"doc_id": "keep", **meta}, "Pelicans nest here.")
    ingest_paths([docs], layout, embedder)
    delete_versions(layout, "acme", ids[0])
    catalog = layout.open_catalog()
    current = catalog.current_generation()
    assert current is not None
    marked = scan(layout.root / current.lexical_dir, ids, [])
    assert marked.tantivy  # one segment, one document of it marked deleted

    report = erase(layout, ann_min_rows=ANN)
    assert report.done and report.tenants_rewritten == 1
    assert scan(layout.root, ids, []).tantivy == []
    assert _found(layout, embedder, "pelicans") == ["keep@1:0"]


def test_a_version_superseded_past_retention_is_deleted_and_erased(
    tmp_path: Path, embedder: Embedder
) -> None:
    layout = DataLayout(tmp_path / "data")
    docs = tmp_path / "docs"
    meta = {"doc_id": "rules", "tenant": "acme", "region": "EU", "acl": ["group:staff"]}
    write_doc(docs, "v1.md", {**meta, "version": "1", "effective_from": "2020-01-01"},
              "Old rules: every blintharp and zuvomeck stays in the vault.")  # fmt: skip
    ingest_paths([docs], layout, embedder)
    write_doc(docs, "v2.md", {**meta, "version": "2", "effective_from": "2021-01-01"},
              "New rules: pelicans stay in the vault.")  # fmt: skip
    ingest_paths([docs], layout, embedder)
    catalog = layout.open_catalog()
    closed = catalog.document("acme", "rules", "1")
    assert closed is not None and closed.closed_by == "rules@2"

    assert delete_superseded(layout, 3650, today=dt.date(2025, 1, 1)) == 0  # not yet
    assert delete_superseded(layout, 30, today=dt.date(2025, 1, 1)) == 1
    assert catalog.document("acme", "rules", "1") is None
    assert catalog.document("acme", "rules", "2") is not None
    assert catalog.erasures.due(3600) is False and len(catalog.erasures.open()) == 1
    report = erase(layout, ann_min_rows=ANN)
    assert report.done
    found = scan(layout.root, ["rules"], [])
    assert found.tantivy == [] and found.files == [], found


def test_old_copies_another_process_is_freeing_at_the_same_time_are_no_error(
    tmp_path: Path,
) -> None:
    # A serving process and `gateway erase` free the same old copies at once, so a file
    # listed by one may be gone when it asks its size: a dangling link is such a file.
    layout = DataLayout(tmp_path / "data")
    old, new = layout.lexical_root / "g000001", layout.lexical_root / "g000002"
    for generation in (old, new):
        generation.mkdir(parents=True)
    (old / "segment").write_bytes(b"x" * 100)
    (old / ".managed.json").symlink_to(old / "removed-by-the-other-process")
    (new / "segment").write_bytes(b"y" * 10)

    assert remove_older_copies(layout, 2) == (1, 100)
    assert not old.exists() and (new / "segment").exists()


def test_what_a_removal_cut_short_left_is_freed_and_counted(tmp_path: Path) -> None:
    # A process killed between renaming an old generation away and deleting it leaves
    # the renamed directory, with the text it held: the next erasure deletes it and
    # counts what it freed, as for any other old copy.
    layout = DataLayout(tmp_path / "data")
    left = layout.lexical_root / ".g000001.removing-4242-0f"
    kept = layout.lexical_root / "g000002"
    (left / "t-x").mkdir(parents=True)
    (left / "t-x" / "segment").write_bytes(b"x" * 100)
    kept.mkdir()
    (kept / "segment").write_bytes(b"y" * 10)
    (left / "t-x" / "linked").hardlink_to(kept / "segment")  # kept: not freed

    assert remove_older_copies(layout, 2) == (1, 100)
    assert sorted(p.name for p in layout.lexical_root.iterdir()) == ["g000002"]


def test_a_delete_made_while_another_process_erased_is_not_marked_done_unerased(
    tmp_path: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two erasers at once (`gateway erase` beside the serving writer): one erases
    everything while the other waits for the writer lock and finds nothing pending; a
    delete committed right then must stay pending, not be marked done with its text
    still on disk."""
    layout = DataLayout(tmp_path / "data")
    ids = _ingest_canaries(tmp_path / "canaries", 2)
    ingest_paths([tmp_path / "canaries"], layout, embedder)
    delete_versions(layout, "acme", ids[0])
    write_step = erasure_module._write

    def others_erased_first_then_a_delete_came(
        layout: DataLayout, ann_min_rows: int, report: erasure_module.ErasureReport
    ) -> None:
        monkeypatch.setattr(erasure_module, "_write", write_step)
        assert erase(layout, ann_min_rows=ann_min_rows).done  # the other process, first
        write_step(layout, ann_min_rows, report)  # finds nothing pending
        delete_versions(layout, "acme", ids[1])  # committed as this one reads on

    monkeypatch.setattr(erasure_module, "_write", others_erased_first_then_a_delete_came)
    report = erase(layout, ann_min_rows=ANN)

    catalog = layout.open_catalog()
    assert not report.done
    assert [r.status for r in catalog.erasures.open()] == ["pending"]
    assert scan(layout.root, [ids[1]], []).tantivy  # still on disk: nothing erased it
    assert erase(layout, ann_min_rows=ANN).done
    assert catalog.erasures.open() == []
    assert scan(layout.root, ids, []).empty


@pytest.mark.server  # a process that ends, for a pid no process has
def test_a_fetch_its_process_did_not_finish_is_freed_and_one_under_way_is_not(
    tmp_path: Path,
) -> None:
    # A replica killed while copying a generation from the object store leaves its
    # staging directory, with that generation's text: the next erasure deletes it and
    # counts it. A fetch whose process still runs (this one's) is left alone, and one
    # named before the pid was in the name goes once it is an hour old.
    layout = DataLayout(tmp_path / "data")
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    killed = layout.lexical_root / f".fetch-{ended.pid}-k1ll3d"
    running = layout.lexical_root / f".fetch-{os.getpid()}-running"
    unnamed_old, unnamed_new = (layout.lexical_root / f".fetch-{n}" for n in ("old0", "new0"))
    for staging in (killed, running, unnamed_old, unnamed_new):
        (staging / "t-x").mkdir(parents=True)
        (staging / "t-x" / "segment.store").write_bytes(b"x" * 100)
    an_hour_ago = time.time() - 3700
    os.utime(unnamed_old, (an_hour_ago, an_hour_ago))

    assert remove_older_copies(layout, 2) == (2, 200)
    assert sorted(p.name for p in layout.lexical_root.iterdir()) == sorted(
        [running.name, unnamed_new.name]
    )


def test_a_version_sent_again_with_its_text_corrected_has_the_old_text_erased(
    tmp_path: Path, embedder: Embedder
) -> None:
    """Sending a version again with other text (a correction: `gateway sync` does it when
    a source's text changed and its version did not) writes over the catalog's row, but
    Tantivy only marks the old one deleted and older generations hold it: it is erased
    as a delete's is. Sent again with only its visibility changed, nothing is erased."""
    layout = DataLayout(tmp_path / "data")
    ids = _ingest_canaries(tmp_path / "canaries", 1)
    ingest_paths([tmp_path / "canaries"], layout, embedder)
    canary = canary_doc(0)
    meta = {k: canary[k] for k in ("doc_id", "version", "region", "acl", "effective_from")}
    corrected = tmp_path / "corrected"
    write_doc(corrected, "c.md", {**meta, "tenant": "acme", "title": "Vault note"}, "A vault.")
    ingest_paths([corrected], layout, embedder)
    catalog = layout.open_catalog()

    assert [(r.reason, r.status) for r in catalog.erasures.open()] == [("replaced", "pending")]
    assert scan(layout.root, ids, []).tantivy  # the old text, only marked deleted
    assert erase(layout, ann_min_rows=ANN).done
    after = scan(layout.root, ids, [])
    assert after.tantivy == [] and after.files == [], after

    widened = tmp_path / "widened"
    acl = ["group:staff", "group:risk"]
    write_doc(
        widened, "c.md", {**meta, "acl": acl, "tenant": "acme", "title": "Vault note"}, "A vault."
    )
    ingest_paths([widened], layout, embedder)
    assert catalog.erasures.open() == []
    assert _found(layout, embedder, "vault") == ["canary-0@1:0"]


def test_the_writer_removes_erased_generations_its_own_data_dir_kept(
    tmp_path: Path, embedder: Embedder
) -> None:
    """With an object store the writer's host has a data dir of its own: an erasure run
    elsewhere (`gateway erase` on another host, or a writer before this one) never
    touched it. The writer removes the generations older than the erasure at its next
    look, not while a replica still serves one of them."""
    layout = DataLayout(tmp_path / "data")
    ids = _ingest_canaries(tmp_path / "canaries", 1)
    ingest_paths([tmp_path / "canaries"], layout, embedder)
    kept = tmp_path / "kept-by-this-host"
    shutil.copytree(layout.lexical_root, kept)  # what this host's data dir held
    delete_versions(layout, "acme", ids[0])
    assert erase(layout, ann_min_rows=ANN).done  # run on another host's data dir
    for generation in kept.iterdir():
        shutil.copytree(generation, layout.lexical_root / generation.name)
    assert scan(layout.root, ids, []).tantivy
    catalog = layout.open_catalog()
    replica = Replicas(catalog.engine)
    replica.report(1)  # a replica still serving a generation from before the erasure
    writer = IngestWorker(layout, embedder, lambda: load_policy(None).policy)

    writer.erase_due()
    assert scan(layout.root, ids, []).tantivy  # it may share this data dir: kept

    replica.leave()
    writer._erase_checked = 0.0  # its next look, a second later
    writer.erase_due()
    assert scan(layout.root, ids, []).tantivy == []


def test_a_tenant_delete_cut_short_keeps_its_deprovisioned_users_refused(
    tmp_path: Path, embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gateway tenant delete` removes the directory last: cut short before the documents
    are gone, a deactivated user's token is still refused, not taken for a caller the
    directory does not know (who passes with the token's groups). Run again, it finishes."""
    layout = DataLayout(tmp_path / "data")
    _ingest_canaries(tmp_path / "canaries", 1)
    ingest_paths([tmp_path / "canaries"], layout, embedder)
    catalog = layout.open_catalog()
    dan, _ = catalog.directory.create_user("acme", UserFields("dan", active=False))

    def crashed(*_: object, **__: object) -> None:
        raise RuntimeError("killed while writing the generation")

    monkeypatch.setattr(tenants_module, "write_generation", crashed)
    with pytest.raises(RuntimeError):
        delete_tenant(layout, "acme")
    monkeypatch.undo()

    assert catalog.tenant_counts("acme")[1] == 1  # still served
    assert catalog.directory.entry("acme", "userName", "dan") == Entry(False, ())
    finished = delete_tenant(layout, "acme")
    assert finished.rows.directory >= 1 and catalog.tenant_counts("acme")[1] == 0
    assert catalog.directory.entry("acme", "userName", "dan") is None


def test_an_old_copy_that_cannot_be_removed_leaves_the_erasure_open(
    tmp_path: Path, embedder: Embedder
) -> None:
    """A removal that failed (no right to delete, a busy mount) was ignored: the erasure
    was marked done, its files counted as freed, with the deleted text still on disk."""
    layout = DataLayout(tmp_path / "data")
    canaries = tmp_path / "canaries"
    ids = _ingest_canaries(canaries, 1)
    ingest_paths([write_corpus(tmp_path / "corpus"), canaries], layout, embedder)
    delete_versions(layout, "acme", ids[0])
    shared = {p.stat().st_ino for p in (layout.lexical_root / "g000002").rglob("*")}
    old = next(  # a file of generation 1 alone (its segments are shared with generation 2)
        p
        for p in (layout.lexical_root / "g000001").rglob("*")
        if p.is_file() and p.stat().st_ino not in shared
    )
    with _undeletable(old):
        report = erase(layout, ann_min_rows=ANN)
        assert not report.done and "could not be removed" in report.waiting_for[0]
        assert len(layout.open_catalog().erasures.open()) == 1  # still to do
    report = erase(layout, ann_min_rows=ANN)
    assert report.done and layout.open_catalog().erasures.open() == []
    assert scan(layout.root, ids, canary_vectors(str(layout.vectors), None, ids)).empty


@contextmanager
def _undeletable(path: Path) -> Iterator[None]:
    """`path` cannot be removed meanwhile (its directory may be renamed away): its
    directory read-only, or, for root (whom modes do not stop), the file immutable."""
    inode, root = path.stat().st_ino, path.parents[2]

    def now() -> Path:  # where the file is now
        return next(p for p in root.rglob(path.name) if p.stat().st_ino == inode)

    if os.geteuid() != 0:
        path.parent.chmod(0o500)
        try:
            yield
        finally:
            now().parent.chmod(0o700)
        return
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("this file system cannot make a file immutable")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(now())], check=True)
