"""A reference connector: mirror a folder of documents into a tenant through the push API.

The files are read as `gateway ingest` reads them (Markdown, text, JSONL, HTML, PDF, with
sidecars and front matter). A state file remembers what was pushed, so each run sends only
the difference:

- a new version, or one whose text or metadata changed: `POST /admin/documents`, in
  batches, then each job is followed to its end (`GET /admin/jobs/{id}`);
- a version whose ACL alone changed: `PUT /admin/documents/{doc_id}/acl` (no re-embedding);
- a version whose file is gone: `DELETE /admin/documents/{doc_id}?version=V`.

A full queue (429) is waited out as its `Retry-After` says. The state is saved after each
step that succeeded, so a run stopped halfway resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from gateway.domain import Document, version_label
from gateway.ingest.records import record_of
from gateway.ingest.sources import load_documents

# Files need not name a tenant: the key's is used. This stands in for it while reading.
KEY_TENANT = "(the key's tenant)"
STATE_FORMAT = 1
POLL_S = 0.25
WINDOW = 4  # batches queued ahead: the writer never waits for the next, and may join them

Version = tuple[str, str]  # (doc_id, version)


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

    @property
    def steps(self) -> int:
        return len(self.upsert) + len(self.acl) + len(self.delete)

    def lines(self) -> Iterator[str]:
        """The plan, one line per change, for --dry-run."""
        yield from (f"+ {d.label}  ({d.source})" for d in self.upsert)
        yield from (f"~ {d.label}  acl {', '.join(d.visibility.acl)}" for d in self.acl)
        yield from (f"- {version_label(doc_id, version)}" for doc_id, version in self.delete)
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


def plan_sync(folder: Path, state: dict[Version, Pushed]) -> Plan:
    """What to send so that the tenant holds exactly the folder's documents."""
    plan = Plan()
    documents = load_documents([folder], {"tenant": KEY_TENANT})  # every problem, at once
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
    plan.delete = sorted(set(state) - seen)
    return plan


class StateFile:
    """The versions pushed to one server, kept as JSON beside the run."""

    def __init__(self, path: Path, url: str) -> None:
        self.path, self.url = path, url
        self.versions: dict[Version, Pushed] = {}
        if path.exists():
            saved = json.loads(path.read_text())
            if saved.get("format") == STATE_FORMAT and saved.get("url") == url:
                self.versions = {
                    (v["doc_id"], v["version"]): Pushed(v["content"], tuple(v["acl"]))
                    for v in saved["versions"]
                }

    def save(self) -> None:
        versions = [
            {"doc_id": d, "version": v, "content": p.content, "acl": list(p.acl)}
            for (d, v), p in sorted(self.versions.items())
        ]
        body = {"format": STATE_FORMAT, "url": self.url, "versions": versions}
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(body, indent=1))
        partial.replace(self.path)  # a crash leaves the old state or the new, never half


class SyncFailed(Exception):
    """The server refused something; the message says what (IDs and fields only)."""


@dataclass
class Connector:
    client: httpx.Client  # base_url and the ingest key's Authorization header set
    state: StateFile
    batch_size: int = 100
    advance: Callable[[int], object] = lambda _n: None  # a progress bar's update

    def run(self, plan: Plan) -> None:
        queued: deque[tuple[dict[str, Any], Sequence[Document]]] = deque()
        for batch in _batches(plan.upsert, self.batch_size):
            body = {"documents": [request_record(d) for d in batch]}
            queued.append((self._call("POST", "/admin/documents", json=body), batch))
            if len(queued) >= WINDOW:
                self._settle(*queued.popleft())
        while queued:
            self._settle(*queued.popleft())
        for doc in plan.acl:
            change = {"acl": list(doc.visibility.acl), "version": doc.version}
            self._call("PUT", f"/admin/documents/{quote(doc.doc_id, safe='')}/acl", json=change)
            self._remember(doc)
        for doc_id, version in plan.delete:
            path = f"/admin/documents/{quote(doc_id, safe='')}"
            self._call("DELETE", path, params={"version": version}, missing_ok=True)
            self.state.versions.pop((doc_id, version), None)
            self.state.save()
            self.advance(1)

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

    def _call(self, method: str, path: str, missing_ok: bool = False, **kwargs: Any) -> Any:
        while True:
            response = self.client.request(method, path, **kwargs)
            if response.status_code == 429:  # the tenant's queue is full: wait as told
                time.sleep(float(response.headers.get("retry-after", "1")))
                continue
            if response.status_code == 404 and missing_ok:  # already gone
                return None
            if response.is_error:
                problem = response.json() if response.content else {}
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
