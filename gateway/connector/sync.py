"""A reference connector: mirror a folder of documents into a tenant through the push API.

The files are read as `gateway ingest` reads them (Markdown, text, JSONL, HTML, PDF, with
sidecars and front matter), never a file outside the folder: a link out of it is skipped
and named. A state file remembers what was pushed, so each run sends only the difference.
It lives outside the folder (by default `$XDG_STATE_HOME/gateway-sync/`, mode 0600): the
folder's writers must not decide what the connector deletes. The server has the last word
anyway: an ingest key deletes or changes only what it pushed itself (403 `not_owner`, which
the connector reports and forgets).

- a new version, or one whose text or metadata changed: `POST /admin/documents`, in
  batches, then each job is followed to its end (`GET /admin/jobs/{id}`);
- a version whose ACL alone changed: `PUT /admin/documents/{doc_id}/acl` (no re-embedding);
- a version whose file is gone: `DELETE /admin/documents/{doc_id}?version=V`.

A state file that an earlier release kept in the folder (`.gateway-sync.json`) is taken
over when no state exists yet, for the versions whose files are in the folder now only
(the others are forgotten, never deleted: the folder's writers may have planted them), and
renamed `.gateway-sync.json.taken-over`, so it is taken over once.

A full queue (429) is waited out as its `Retry-After` says. The state is saved after each
step that succeeded, so a run stopped halfway resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from gateway.domain import Document, version_label
from gateway.ingest.records import record_of
from gateway.ingest.sources import load_documents, read_inside

# Files need not name a tenant: the key's is used. This stands in for it while reading.
KEY_TENANT = "(the key's tenant)"
SKIPPED = "a link to a place outside the folder, not read"
STATE_FORMAT = 1
LEGACY_STATE = ".gateway-sync.json"  # where earlier releases kept it: inside the folder
TAKEN_OVER = ".taken-over"  # the legacy file's suffix once taken over
POLL_S = 0.25
WINDOW = 4  # batches queued ahead: the writer never waits for the next, and may join them

Version = tuple[str, str]  # (doc_id, version)
NOT_OURS = object()  # a delete the server refused: the version was not pushed by this key


@dataclass(frozen=True)
class Pushed:
    """What the state file remembers of one version."""

    content: str  # hash of everything but the ACL
    acl: tuple[str, ...]


@dataclass
class Plan:
    upsert: list[Document] = field(default_factory=list)  # new or changed
    acl: list[Document] = field(default_factory=list)  # only the ACL changed
    delete: list[Version] = field(default_factory=list)  # the file is gone
    unchanged: int = 0
    skipped: list[Path] = field(default_factory=list)  # links out of the folder, not read
    forgotten: list[Version] = field(default_factory=list)  # taken over, not in the folder

    @property
    def steps(self) -> int:
        return len(self.upsert) + len(self.acl) + len(self.delete)

    def lines(self) -> Iterator[str]:
        """The plan, one line per change, for --dry-run."""
        yield from (f"+ {d.label}  ({d.source})" for d in self.upsert)
        yield from (f"~ {d.label}  acl {', '.join(d.visibility.acl)}" for d in self.acl)
        yield from (f"- {version_label(doc_id, version)}" for doc_id, version in self.delete)
        yield from (f"! {path}  skipped: {SKIPPED}" for path in self.skipped)
        yield from (
            f"? {version_label(doc_id, version)}  forgotten: in the state taken over, not in "
            "the folder (never deleted)"
            for doc_id, version in self.forgotten
        )
        yield (
            f"{len(self.upsert)} to send, {len(self.acl)} ACL changes, "
            f"{len(self.delete)} to delete, {self.unchanged} unchanged"
        )


def request_record(doc: Document) -> dict[str, Any]:
    """The document as `POST /admin/documents` takes it; the tenant only if the file named one."""
    record = record_of(doc)
    if doc.visibility.tenant != KEY_TENANT:
        record["tenant"] = doc.visibility.tenant
    return record


def pushed(doc: Document) -> Pushed:
    record = {k: v for k, v in request_record(doc).items() if k != "acl"}
    content = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
    return Pushed(content, doc.visibility.acl)


def plan_sync(folder: Path, state: dict[Version, Pushed], taken_over: bool = False) -> Plan:
    """What to send so that the tenant holds exactly the folder's documents. A state just
    `taken_over` from the folder is trusted for what the folder holds only: its versions
    whose files are not there are forgotten, never deleted."""
    plan = Plan()
    # Every problem at once; links out of the folder are skipped, never read.
    documents = load_documents([folder], {"tenant": KEY_TENANT}, skipped=plan.skipped)
    seen = set()
    for doc in documents:
        seen.add((doc.doc_id, doc.version))
        before, now = state.get((doc.doc_id, doc.version)), pushed(doc)
        if before is None or before.content != now.content:
            plan.upsert.append(doc)
        elif before.acl != now.acl:
            plan.acl.append(doc)
        else:
            plan.unchanged += 1
    gone = sorted(set(state) - seen)
    if taken_over:
        plan.forgotten = gone
    else:
        plan.delete = gone
    return plan


def state_path(state_dir: Path, folder: Path, url: str) -> Path:
    """The state of mirroring `folder` to `url`: one file per pair, named by their hash."""
    digest = hashlib.sha256(f"{folder.resolve()}\n{url}".encode()).hexdigest()[:32]
    return state_dir / f"{digest}.json"


class StateFile:
    """The versions pushed to one server, kept as JSON outside the folder (0600)."""

    def __init__(self, path: Path, url: str) -> None:
        self.path, self.url = path, url
        self.versions: dict[Version, Pushed] = {}
        if path.exists():
            self.versions = self._parse(path.read_bytes())

    def _parse(self, raw: bytes) -> dict[Version, Pushed]:
        saved = json.loads(raw)
        if saved.get("format") != STATE_FORMAT or saved.get("url") != self.url:
            return {}
        return {
            (v["doc_id"], v["version"]): Pushed(v["content"], tuple(v["acl"]))
            for v in saved["versions"]
        }

    def take_over(self, folder: Path) -> Path | None:
        """While this state is new: what an earlier release kept in the folder (read without
        following a link out of it); its path, or None. Saved by `taken_over` once planned
        (`plan_sync(..., taken_over=True)` forgets what the folder does not hold)."""
        legacy = folder / LEGACY_STATE
        if self.path.exists() or not legacy.is_file():
            return None
        try:
            self.versions = self._parse(read_inside(legacy, folder.resolve()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # unreadable or not ours: start afresh, as without one
        return legacy

    def taken_over(self, legacy: Path, forgotten: Sequence[Version]) -> None:
        """Save the state taken over from `legacy`, less the `forgotten` versions, and
        rename `legacy` so that it is never taken over again (a folder's writer may plant
        another: it is then ignored, as any state file in the folder is once one exists)."""
        for version in forgotten:
            self.versions.pop(version, None)
        self.save()
        legacy.rename(legacy.with_name(legacy.name + TAKEN_OVER))

    def save(self) -> None:
        versions = [
            {"doc_id": d, "version": v, "content": p.content, "acl": list(p.acl)}
            for (d, v), p in sorted(self.versions.items())
        ]
        body = {"format": STATE_FORMAT, "url": self.url, "versions": versions}
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.unlink(missing_ok=True)  # created afresh below, 0600 from the start
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(partial, flags, 0o600), "w") as handle:
            handle.write(json.dumps(body, indent=1))
        partial.replace(self.path)  # a crash leaves the old state or the new, never half


class SyncFailed(Exception):
    """The server refused something; the message says what (IDs and fields only)."""


@dataclass
class Connector:
    client: httpx.Client  # base_url and the ingest key's Authorization header set
    state: StateFile
    batch_size: int = 100
    advance: Callable[[int], object] = lambda _n: None  # a progress bar's update
    refused: list[str] = field(default_factory=list)  # deletes the server said were not ours
    # ACL changes not made: the version is another key's now, or gone from the server
    unchanged_acls: list[str] = field(default_factory=list)

    def run(self, plan: Plan) -> None:
        """Upserts, ACL changes, then deletes; the deletes also when the server refused an
        earlier step: a file removed at the source must not stay readable because
        another file's job was refused."""
        try:
            self._upsert(plan)
            self._change_acls(plan)
        except SyncFailed:  # the server refused something: the removals still go, but
            # not a version another one of the same document was to replace
            self._delete(plan, keep={d.doc_id for d in plan.upsert})
            raise
        self._delete(plan)

    def _upsert(self, plan: Plan) -> None:
        queued: deque[tuple[dict[str, Any], Sequence[Document]]] = deque()
        for batch in _batches(plan.upsert, self.batch_size):
            body = {"documents": [request_record(d) for d in batch]}
            queued.append((self._call("POST", "/admin/documents", json=body), batch))
            if len(queued) >= WINDOW:
                self._settle(*queued.popleft())
        while queued:
            self._settle(*queued.popleft())

    def _change_acls(self, plan: Plan) -> None:
        for doc in plan.acl:
            change = {"acl": list(doc.visibility.acl), "version": doc.version}
            path = f"/admin/documents/{quote(doc.doc_id, safe='')}/acl"
            done = self._call("PUT", path, json=change, missing_ok=True)
            if done is None or done is NOT_OURS:  # gone, or another key's since: forgotten
                why = "not pushed by this key (403 not_owner)" if done else "gone (404)"
                self.unchanged_acls.append(f"{version_label(doc.doc_id, doc.version)} {why}")
                self._forget(doc.doc_id, doc.version)
                continue
            self._remember(doc)

    def _delete(self, plan: Plan, keep: Collection[str] = ()) -> None:
        for doc_id, version in plan.delete:
            if doc_id in keep:
                continue
            path = f"/admin/documents/{quote(doc_id, safe='')}"
            done = self._call("DELETE", path, params={"version": version}, missing_ok=True)
            if done is NOT_OURS:  # never pushed by this key: forgotten, not retried forever
                self.refused.append(version_label(doc_id, version))
            self._forget(doc_id, version)

    def _settle(self, job: dict[str, Any], batch: Sequence[Document]) -> None:
        """Follow a job to its end; remember its documents once it has succeeded."""
        while job["status"] in ("queued", "running"):
            time.sleep(POLL_S)
            job = self._call("GET", f"/admin/jobs/{job['job_id']}")
        if job["status"] != "succeeded":
            raise SyncFailed(f"job {job['job_id']} failed: {_problems(job['errors'], batch)}")
        self.state.versions.update({(d.doc_id, d.version): pushed(d) for d in batch})
        self.state.save()
        self.advance(len(batch))

    def _remember(self, doc: Document) -> None:
        self.state.versions[(doc.doc_id, doc.version)] = pushed(doc)
        self.state.save()
        self.advance(1)

    def _forget(self, doc_id: str, version: str) -> None:
        self.state.versions.pop((doc_id, version), None)
        self.state.save()
        self.advance(1)

    def _call(self, method: str, path: str, missing_ok: bool = False, **kwargs: Any) -> Any:
        while True:
            response = self.client.request(method, path, **kwargs)
            if response.status_code == 429:  # the tenant's queue is full: wait as told
                time.sleep(float(response.headers.get("retry-after", "1")))
                continue
            if response.status_code == 404 and missing_ok:  # already gone
                return None
            problem = response.json() if response.is_error and response.content else {}
            if missing_ok and problem.get("code") == "not_owner":
                return NOT_OURS
            if response.is_error:
                errors = problem.get("errors") or []
                detail = _problems(errors, []) if errors else problem.get("detail", "")
                raise SyncFailed(f"{method} {path}: {response.status_code} {detail}")
            return response.json()


def _problems(errors: Sequence[dict[str, Any]], batch: Sequence[Document]) -> str:
    sources: dict[Any, str] = {i: d.source for i, d in enumerate(batch)}
    return "; ".join(
        f"{sources.get(e.get('index'), e.get('doc_id') or 'batch')}: "
        f"{e.get('field') or '-'}: {e.get('message')}"
        for e in errors
    )


def _batches(documents: Sequence[Document], size: int) -> Iterator[Sequence[Document]]:
    for start in range(0, len(documents), size):
        yield documents[start : start + size]
