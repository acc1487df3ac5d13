"""A reference connector: mirror a folder of documents into a tenant through the push API.

The files are read as `gateway ingest` reads them (Markdown, text, JSONL, HTML, PDF, with
sidecars and front matter), never a file outside the folder: a link out of it is skipped
and named, and so is a link to a file in it (that file is read where it lies, under its
own name). A state file remembers what was pushed, so each run sends only the difference.
It lives outside the folder (by default `$XDG_STATE_HOME/gateway-sync/`, mode 0600): the
folder's writers must not decide what the connector deletes. The server has the last word
anyway: an ingest key deletes or changes only what it pushed itself (403 `not_owner`, which
the connector reports and forgets).

- a new version, or one whose text or metadata changed: `POST /admin/documents`, in
  batches of at most `batch_size` documents and `max_request_bytes` bytes (the server's
  body limit, 413 past it), then each job is followed to its end (`GET /admin/jobs/{id}`);
  a document whose request alone is over that limit is not sent but named, the others go,
  and a version of its document whose file is gone is kept until it can be sent;
- a version whose ACL alone changed: `PUT /admin/documents/{doc_id}/acl` (no re-embedding);
- a version whose file is gone: `DELETE /admin/documents/{doc_id}?version=V`.

Before anything is sent, every document to send and every ACL change is checked with the
server's own validation (`validated_batch`, `AclChange`): a file the server would refuse
refuses the run (DocumentsRefused), naming the file and the field. A file naming a tenant
cannot be checked here (the key's tenant is the server's to know): the first batch holds
the documents naming one and is sent before any other step, so a tenant that is not the
key's (403 `tenant_mismatch`) stops the run with nothing done. ACL changes go next, before
the other batches: a narrowed ACL must not wait for embedding, nor be skipped because a
batch is refused.

A document that names no `uri` of its own (front matter, sidecar, JSONL record) is sent
with its file's path relative to the folder (`handbook/travel.md`), or that path joined
to `uri_base` (`--uri-base https://files.example.com/hr`): never the path on this host,
which told every reader where the share is mounted. A folder that lists no document while
the state knows versions pushed from it (a mount that is not there shows an empty folder)
is refused, `FolderEmpty`, unless the run allows it (`--allow-empty`): it would delete
every document.

A state file that an earlier release kept in the folder (`.gateway-sync.json`) is taken
over when no state exists yet, for the versions whose files are in the folder now only
(the others are forgotten, never deleted: the folder's writers may have planted them), and
renamed `.gateway-sync.json.taken-over`, so it is taken over once.

A full queue (429) is waited out as its `Retry-After` says (seconds or an HTTP date), for
at most `BACKLOG_TRIES` answers and `BACKLOG_WAIT_S` seconds per request. The state is
saved after each step that succeeded, so a run stopped halfway resumes where it stopped.
An answer that is not the gateway's (a proxy's HTML page, a redirect, another server) stops
the run, and so does a state file that cannot be read: nothing is planned from it.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import hashlib
import json
import os
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
from pydantic import ValidationError

from gateway.api.batches import validated_batch
from gateway.api.schemas import AclChange
from gateway.domain import Document, version_label
from gateway.errors import GatewayError
from gateway.ingest.parse import DocumentProblem, DocumentsRefused
from gateway.ingest.records import record_of
from gateway.ingest.sources import load_documents, read_inside
from gateway.uris import as_relative_path

# Files need not name a tenant: the key's is used. This stands in for it while reading.
KEY_TENANT = "(the key's tenant)"
SKIPPED = "a link to a place outside the folder, not read"
LINKED = "a link to a file in the folder, read there under its own name"
# The gateway's body limit for POST /admin/documents (gateway/api/limits.py; not imported:
# it would load the server's state for a command that only talks to it over HTTP).
MAX_REQUEST_BYTES = 32 * 1024 * 1024
BODY_START, BODY_END = b'{"documents":[', b"]}"  # a request's body, around its records
STATE_FORMAT = 1
LEGACY_STATE = ".gateway-sync.json"  # where earlier releases kept it: inside the folder
TAKEN_OVER = ".taken-over"  # the legacy file's suffix once taken over
POLL_S = 0.25
WINDOW = 4  # batches queued ahead: the writer never waits for the next, and may join them
BACKLOG_TRIES = 60  # 429 answers to one request before the run stops
BACKLOG_WAIT_S = 900.0  # seconds one request waits out 429s, at most, before the run stops
JOB_STATUSES = ("queued", "running", "succeeded", "failed")

Version = tuple[str, str]  # (doc_id, version)
DONE = ("sent", "ACL changes", "deleted")  # what a run that stopped reports it had done
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
    linked: list[Path] = field(default_factory=list)  # links to files in it, read there
    # Documents whose request alone is over the limit, with its size in bytes: not sent
    too_large: list[tuple[Document, int]] = field(default_factory=list)
    max_request_bytes: int = MAX_REQUEST_BYTES
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
        yield from (f"! {path}  skipped: {LINKED}" for path in self.linked)
        yield from (
            f"! {d.source}  not sent: {d.label} makes a request of {size} bytes, over the "
            f"limit of {self.max_request_bytes} bytes"
            for d, size in self.too_large
        )
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


def request_json(doc: Document) -> bytes:
    """The document's record as it is sent, encoded (as httpx encodes `json=`)."""
    return json.dumps(request_record(doc), ensure_ascii=False, separators=(",", ":")).encode()


def request_size(records: Sequence[bytes]) -> int:
    """The bytes of the body holding `records`, encoded by `request_json`."""
    return len(BODY_START) + sum(map(len, records)) + max(len(records) - 1, 0) + len(BODY_END)


def pushed(doc: Document) -> Pushed:
    record = {k: v for k, v in request_record(doc).items() if k != "acl"}
    content = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
    return Pushed(content, doc.visibility.acl)


class FolderEmpty(Exception):
    """The folder lists no document, yet the state knows versions pushed from it: planned,
    every one of them would be deleted. The message says so and how to allow it."""


def plan_sync(
    folder: Path,
    state: dict[Version, Pushed],
    taken_over: bool = False,
    *,
    uri_base: str | None = None,
    allow_empty: bool = False,
    max_request_bytes: int = MAX_REQUEST_BYTES,
) -> Plan:
    """What to send so that the tenant holds exactly the folder's documents. A state just
    `taken_over` from the folder is trusted for what the folder holds only: its versions
    whose files are not there are forgotten, never deleted. FolderEmpty when the folder
    lists no document and the state knows some, unless `allow_empty`. A document whose
    request alone is over `max_request_bytes` is left out, in `too_large`."""
    plan = Plan(max_request_bytes=max_request_bytes)
    # Every problem at once; links are skipped, never read (one to a file in the folder
    # reaches it under its own name).
    loaded = load_documents(
        [folder], {"tenant": KEY_TENANT}, skipped=plan.skipped, linked=plan.linked
    )
    documents = [folder_uri(doc, folder, uri_base) for doc in loaded]
    if not documents and state and not taken_over and not allow_empty:
        raise FolderEmpty(
            f"{folder} lists no documents, but {len(state)} versions were pushed from it "
            "(a share that is not mounted looks like an empty folder); nothing was sent. "
            "To delete them all, run again with --allow-empty"
        )
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
    problems = server_problems(plan)
    if problems:
        raise DocumentsRefused(problems)
    sizes = [(doc, request_size([request_json(doc)])) for doc in plan.upsert]
    plan.upsert = [doc for doc, size in sizes if size <= max_request_bytes]
    plan.too_large = [(doc, size) for doc, size in sizes if size > max_request_bytes]
    # The version a document that cannot be sent was to replace stays, as when a batch
    # is refused: the document must not vanish because its new version is too large.
    unsent = {doc.doc_id for doc, _ in plan.too_large}
    plan.delete = [version for version in plan.delete if version[0] not in unsent]
    return plan


def server_problems(plan: Plan) -> list[DocumentProblem]:
    """What the server would refuse in `plan`, by its own checks, per file and field: each
    document to send as `POST /admin/documents` validates it, each ACL change as the ACL
    route's model does. Files naming two tenants or more are refused too: a key writes to
    one tenant only (which one, the server alone knows)."""
    problems: list[DocumentProblem] = []
    tenants = sorted({d.visibility.tenant for d in plan.upsert} - {KEY_TENANT})
    if len(tenants) > 1:
        for doc in plan.upsert:
            if doc.visibility.tenant != KEY_TENANT:
                others = ", ".join(t for t in tenants if t != doc.visibility.tenant)
                message = f"other files name {others}: a key writes to its own tenant only"
                problems.append(DocumentProblem(doc.source, "tenant", message))
    tenant = tenants[0] if len(tenants) == 1 else KEY_TENANT  # mismatches: reported above
    for doc in plan.upsert:
        record = request_record(doc)
        if len(tenants) > 1:
            record.pop("tenant", None)
        try:  # one document a batch: every problem of every file is listed
            validated_batch(json.dumps({"documents": [record]}).encode(), tenant)
        except GatewayError as exc:
            errors = (exc.extra or {}).get("errors") or [{"field": None, "message": exc.detail}]
            problems += [
                DocumentProblem(doc.source, e["field"] or "-", e["message"]) for e in errors
            ]
    for doc in plan.acl:
        try:
            AclChange.model_validate({"acl": list(doc.visibility.acl), "version": doc.version})
        except ValidationError as exc:  # its messages name limits, never the value
            problems += [
                DocumentProblem(doc.source, str(e["loc"][0]), e["msg"]) for e in exc.errors()
            ]
    return sorted(problems, key=lambda p: p.source)  # by file; stable within one


def folder_uri(doc: Document, folder: Path, uri_base: str | None = None) -> Document:
    """`doc` with the uri its file's path gave it (as `gateway ingest` names one that names
    none) made relative to `folder`, or joined to `uri_base`; a uri the document names
    itself is kept as it is."""
    source = Path(doc.source)
    if doc.uri != as_relative_path(doc.source) or not source.is_relative_to(folder):
        return doc  # its own uri (a JSONL line's source is `file:line`: never its uri)
    relative = source.relative_to(folder).as_posix()
    if uri_base is not None:
        return replace(doc, uri=f"{uri_base.rstrip('/')}/{quote(relative)}")
    return replace(doc, uri=as_relative_path(relative))


def state_path(state_dir: Path, folder: Path, url: str, key: str | None = None) -> Path:
    """The state of mirroring `folder` to `url` with `key`: one file per folder, URL and
    key, named by their hash. Per key, because a key writes to its own tenant: one folder
    mirrored into two tenants is two mirrors, and one's state must not decide what the
    other is sent or deleted. Only the key's ID goes into the hash, never its secret; no
    key (None) names the file an earlier release kept per folder and URL."""
    named = f"{folder.resolve()}\n{url}" + (f"\n{key_id(key)}" if key is not None else "")
    digest = hashlib.sha256(named.encode()).hexdigest()[:32]
    return state_dir / f"{digest}.json"


def key_id(key: str) -> str:
    """The ID part of an API key (`gk_<id>_<secret>`); for anything else, a hash of it."""
    found, _, secret = key.removeprefix("gk_").partition("_")
    if key.startswith("gk_") and found.isalnum() and secret:
        return found
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class StateUnreadable(Exception):
    """The state file cannot be read, or holds no state: nothing may be planned from it
    (what it lists decides the deletes). The message names the file and why."""


class StateFile:
    """The versions pushed to one server, kept as JSON outside the folder (0600)."""

    def __init__(self, path: Path, url: str) -> None:
        self.path, self.url = path, url
        self.versions: dict[Version, Pushed] = {}
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return  # none yet
        except OSError as exc:  # a directory, no permission...
            why = exc.strerror or type(exc).__name__
            raise StateUnreadable(f"cannot read the state file {path}: {why}") from None
        try:
            self.versions = self._parse(raw)
        except ValueError as exc:
            raise StateUnreadable(f"the state file {path} is not a state: {exc}") from None

    def _parse(self, raw: bytes) -> dict[Version, Pushed]:
        """The versions `raw` lists for this URL (none for another URL or format), or
        ValueError saying what is wrong (never quoting the file)."""
        try:
            saved = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc.msg} at line {exc.lineno})") from None
        except ValueError:  # UnicodeDecodeError: names a byte only
            raise ValueError("not UTF-8 JSON") from None
        if not isinstance(saved, dict):
            raise ValueError(f"a JSON {type(saved).__name__}, not an object")
        if saved.get("format") != STATE_FORMAT or saved.get("url") != self.url:
            return {}
        listed = saved.get("versions")
        if not isinstance(listed, list):
            raise ValueError("no list of versions")
        versions: dict[Version, Pushed] = {}
        for number, v in enumerate(listed, 1):
            fields = ("doc_id", "version", "content")
            if not (
                isinstance(v, dict)
                and all(isinstance(v.get(name), str) for name in fields)
                and isinstance(v.get("acl"), list)
                and all(isinstance(p, str) for p in v["acl"])
            ):
                raise ValueError(f"version {number} of {len(listed)} is not one")
            versions[(v["doc_id"], v["version"])] = Pushed(v["content"], tuple(v["acl"]))
        return versions

    def take_over(self, folder: Path) -> Path | None:
        """While this state is new: what an earlier release kept in the folder (read without
        following a link out of it); its path, or None. Saved by `taken_over` once planned
        (`plan_sync(..., taken_over=True)` forgets what the folder does not hold)."""
        legacy = folder / LEGACY_STATE
        if self.path.exists() or not legacy.is_file():
            return None
        try:
            self.versions = self._parse(read_inside(legacy, folder.resolve()))
        except (OSError, ValueError):
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
    """The server refused something, or what answered is not a gateway; the message says
    what (IDs and fields only), `code` the gateway's error code, if it gave one."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class TenantRefused(SyncFailed):
    """The first batch was refused 403 `tenant_mismatch`: nothing was sent or changed."""


def without_userinfo(url: str) -> str:
    """`url` as it may be shown: without the user name and password it may hold."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket: show nothing of it
        return "(an invalid URL)"
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def retry_after_s(value: str | None, now: float) -> float | None:
    """The seconds a `Retry-After` asks to wait (RFC 9110 10.2.3: delay-seconds or an
    HTTP date, counted from `now`, a Unix time); None when absent or unreadable."""
    value = (value or "").strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000": an HTTP date is in GMT anyway
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, when.timestamp() - now)


@dataclass
class Connector:
    client: httpx.Client  # base_url and the ingest key's Authorization header set
    state: StateFile
    batch_size: int = 100
    advance: Callable[[int], object] = lambda _n: None  # a progress bar's update
    max_request_bytes: int = MAX_REQUEST_BYTES  # the plan left out any document over it
    refused: list[str] = field(default_factory=list)  # deletes the server said were not ours
    # ACL changes not made: the version is another key's now, or gone from the server
    unchanged_acls: list[str] = field(default_factory=list)
    done: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DONE, 0))

    def run(self, plan: Plan) -> None:
        """The first batch (sent, not yet followed), ACL changes, the other batches, then
        deletes. A first batch refused for its tenant stops everything (nothing was sent
        yet). Otherwise, when the server refuses a batch, the ACL changes and the deletes
        still go: a narrowed ACL or a file removed at the source must not stay readable
        because another file's job was refused. The message then says what was done."""
        # Documents naming a tenant first: the first request tells whether it is the key's.
        upsert = sorted(plan.upsert, key=lambda d: d.visibility.tenant == KEY_TENANT)
        batches = list(_batches(upsert, self.batch_size, self.max_request_bytes))
        queued: deque[tuple[dict[str, Any], Sequence[Document]]] = deque()
        refused: SyncFailed | None = None
        try:
            if batches:
                queued.append(self._post(batches[0]))
        except SyncFailed as exc:
            if exc.code == "tenant_mismatch":
                raise _tenant_refused(upsert) from None
            refused = exc
        try:
            self._change_acls(plan)
            if refused is not None:
                raise refused
            self._upsert(batches[1:], queued)
        except SyncFailed as exc:  # the removals still go, but not a version another one
            # of the same document was to replace
            self._delete(plan, keep={d.doc_id for d in plan.upsert})
            made = ", ".join(f"{n} {what}" for what, n in self.done.items())
            # A refused first batch and a failed ACL change after it: both are said
            why = str(exc) if refused in (None, exc) else f"{refused}; then {exc}"
            raise SyncFailed(f"{why}; done before stopping: {made}", exc.code) from None
        self._delete(plan)

    def _post(self, batch: Sequence[Document]) -> tuple[dict[str, Any], Sequence[Document]]:
        # Encoded here, as `_batches` measured it: the body sent is the size planned.
        body = BODY_START + b",".join(map(request_json, batch)) + BODY_END
        headers = {"Content-Type": "application/json"}
        return self._job("POST", "/admin/documents", content=body, headers=headers), batch

    def _upsert(
        self,
        batches: Sequence[Sequence[Document]],
        queued: deque[tuple[dict[str, Any], Sequence[Document]]],
    ) -> None:
        """Send `batches` after the `queued` ones, WINDOW ahead; follow every job."""
        for batch in batches:
            queued.append(self._post(batch))
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
            self.done["ACL changes"] += 1

    def _delete(self, plan: Plan, keep: Collection[str] = ()) -> None:
        for doc_id, version in plan.delete:
            if doc_id in keep:
                continue
            path = f"/admin/documents/{quote(doc_id, safe='')}"
            done = self._call("DELETE", path, params={"version": version}, missing_ok=True)
            if done is NOT_OURS:  # never pushed by this key: forgotten, not retried forever
                self.refused.append(version_label(doc_id, version))
            else:
                self.done["deleted"] += 1
            self._forget(doc_id, version)

    def _settle(self, job: dict[str, Any], batch: Sequence[Document]) -> None:
        """Follow a job to its end; remember its documents once it has succeeded."""
        while job["status"] in ("queued", "running"):
            time.sleep(POLL_S)
            job = self._job("GET", f"/admin/jobs/{quote(job['job_id'], safe='')}")
        if job["status"] != "succeeded":
            raise SyncFailed(f"job {job['job_id']} failed: {_problems(_errors(job), batch)}")
        self.state.versions.update({(d.doc_id, d.version): pushed(d) for d in batch})
        self.state.save()
        self.advance(len(batch))
        self.done["sent"] += len(batch)

    def _remember(self, doc: Document) -> None:
        self.state.versions[(doc.doc_id, doc.version)] = pushed(doc)
        self.state.save()
        self.advance(1)

    def _forget(self, doc_id: str, version: str) -> None:
        self.state.versions.pop((doc_id, version), None)
        self.state.save()
        self.advance(1)

    def _job(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        """The ingest job the gateway answers with; SyncFailed for anything else."""
        job: dict[str, Any] = self._call(method, path, **kwargs)
        if not isinstance(job.get("job_id"), str) or job.get("status") not in JOB_STATUSES:
            raise SyncFailed(f"{method} {path}: not a gateway's ingest job: is the URL right?")
        return job

    def _call(self, method: str, path: str, missing_ok: bool = False, **kwargs: Any) -> Any:
        """The gateway's answer, a JSON object; None for a 404 `not_found` and NOT_OURS for
        a 403 `not_owner` when `missing_ok`. A 429 is waited out as its `Retry-After` says
        (1 s without one), within `BACKLOG_TRIES` and `BACKLOG_WAIT_S`; any other error,
        or an answer that is not the gateway's, is SyncFailed."""
        waited = 0.0
        for tries in range(1, BACKLOG_TRIES + 1):
            response = self.client.request(method, path, **kwargs)
            if response.status_code != 429:
                break
            wait = retry_after_s(response.headers.get("retry-after"), time.time())
            wait = 1.0 if wait is None else wait
            if waited + wait > BACKLOG_WAIT_S:
                raise SyncFailed(
                    f"{method} {path}: 429{_detail(response)}: still refused after "
                    f"{tries} tries over {waited:.0f} s, and asked to wait {wait:.0f} s more "
                    f"(at most {BACKLOG_WAIT_S:.0f} s are waited per request); run again later"
                )
            if tries < BACKLOG_TRIES:
                time.sleep(wait)
                waited += wait
        else:
            raise SyncFailed(
                f"{method} {path}: 429{_detail(response)}: still refused after {BACKLOG_TRIES} "
                f"tries over {waited:.0f} s; run again later"
            )
        status = response.status_code
        if response.is_redirect:  # never followed: the key would go where it points
            where = without_userinfo(response.headers.get("location", "nowhere"))
            raise SyncFailed(
                f"{method} {path}: {status} a redirect to {where}, not followed: give the "
                "gateway's own URL"
            )
        answer = _answer_of(response)
        if answer is None:
            kind = response.headers.get("content-type", "").split(";")[0] or "no content type"
            raise SyncFailed(
                f"{method} {path}: {status}, not a gateway response ({kind}): is the URL right?"
            )
        if missing_ok and status == 404 and answer.get("code") == "not_found":  # gone
            return None
        if missing_ok and status == 403 and answer.get("code") == "not_owner":
            return NOT_OURS
        if not response.is_success:
            code = answer.get("code")
            raise SyncFailed(
                f"{method} {path}: {status}{_detail(response)}",
                code if isinstance(code, str) else None,
            )
        return answer


def _tenant_refused(upsert: Sequence[Document]) -> TenantRefused:
    """The files naming a tenant, which the server said is not the key's."""
    named = [d for d in upsert if d.visibility.tenant != KEY_TENANT]
    listed = "; ".join(
        f"{d.source}: tenant: {d.visibility.tenant} is not the key's tenant" for d in named
    )
    return TenantRefused(
        f"refused (403 tenant_mismatch), nothing was queued or changed: {listed}", "tenant_mismatch"
    )


def _answer_of(response: httpx.Response) -> dict[str, Any] | None:
    """The JSON object the gateway answers with (a problem for an error), or None for
    anything else: HTML, text, a JSON list, nothing."""
    try:
        answer = response.json()
    except ValueError:  # not JSON, or not UTF-8
        return None
    return answer if isinstance(answer, dict) else None


def _detail(response: httpx.Response) -> str:
    """What a gateway's problem says (its errors, or its detail), after a space; "" for
    anything else."""
    problem = _answer_of(response) or {}
    errors = _errors(problem)
    detail = _problems(errors, []) if errors else problem.get("detail")
    return f" {detail}" if detail and isinstance(detail, str) else ""


def _errors(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The `errors` of a job or a problem: a list of objects, else none."""
    errors = answer.get("errors")
    return [e for e in errors if isinstance(e, dict)] if isinstance(errors, list) else []


def _problems(errors: Sequence[dict[str, Any]], batch: Sequence[Document]) -> str:
    sources: dict[Any, str] = {i: d.source for i, d in enumerate(batch)}
    return "; ".join(
        f"{sources.get(e.get('index'), e.get('doc_id') or 'batch')}: "
        f"{e.get('field') or '-'}: {e.get('message')}"
        for e in errors
    )


def _batches(
    documents: Sequence[Document], size: int, max_bytes: int
) -> Iterator[Sequence[Document]]:
    """`documents` in order, in batches of at most `size` documents whose request is at
    most `max_bytes` bytes (a document over it alone, which the plan leaves out, goes on
    its own)."""
    batch: list[Document] = []
    records: list[bytes] = []
    for doc in documents:
        record = request_json(doc)
        if batch and (len(batch) == size or request_size([*records, record]) > max_bytes):
            yield batch
            batch, records = [], []
        batch.append(doc)
        records.append(record)
    if batch:
        yield batch
