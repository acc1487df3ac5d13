"""`gateway sync` when something is wrong outside the folder's documents: what answers at
the URL is not the gateway (an HTML page, a redirect, `python -m http.server`), the state
file or the key file cannot be read, the URL holds a password, the queue stays full, or a
document holds a lone surrogate. Each ends in one clear line and exit status 1, never a
traceback, and none of them deletes anything. Documents too large for one request, and
what a run that stopped says it was refused, are here too.

The other end is a real HTTP server on loopback, in a thread of the test: a small fake of
the push API that records every request, or Python's own `http.server`."""

from __future__ import annotations

import email.utils
import http.server
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from gateway.api.limits import body_limit
from gateway.bench.server import free_port, gateway_command
from gateway.connector.sync import (
    BACKLOG_TRIES,
    MAX_REQUEST_BYTES,
    STATE_FORMAT,
    StateFile,
    StateUnreadable,
    retry_after_s,
    without_userinfo,
)
from gateway.errors import GatewayError
from tests.helpers.documents import write_doc
from tests.helpers.processes import gateway_env

META = {"tenant": "acme", "region": "EU", "effective_from": "2020-01-01", "acl": ["group:staff"]}
KEY = "gk_test_0123456789abcdef"
HTML = b"<html><body><h1>502 Bad Gateway</h1><p>nginx</p></body></html>"
JOB = {"job_id": "job-1", "status": "succeeded", "errors": []}
# A version of a state whose doc_id is no string: its delete would have been planned
ENTRY = {"doc_id": 7, "version": "1", "content": "c", "acl": ["group:staff"]}

# (status, headers, body) for one request, given (method, path)
Answer = tuple[int, dict[str, str], bytes]


def as_json(status: int, body: Any, **headers: str) -> Answer:
    return status, {"Content-Type": "application/json", **headers}, json.dumps(body).encode()


def the_gateway(method: str, path: str) -> Answer:
    """The push API as the connector needs it: every job succeeds, every delete is done."""
    if method == "POST" and path == "/admin/documents":
        return as_json(202, JOB)
    return as_json(200, {"doc_id": path.split("/")[3].split("?")[0], "versions": ["1"]})


@dataclass
class Fake:
    """An HTTP server answering as `answer` says, and the requests it was sent."""

    url: str
    answer: Callable[[str, str], Answer] = the_gateway
    requests: list[tuple[str, str, float]] = field(default_factory=list)
    limit: int | None = None  # bodies over it are refused 413, as the gateway refuses them
    sizes: list[int] = field(default_factory=list)  # of every body received

    def sent(self, method: str) -> list[str]:
        return [path for m, path, _ in self.requests if m == method]


@pytest.fixture
def fake() -> Iterator[Fake]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    faked = Fake(f"http://127.0.0.1:{server.server_address[1]}")

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            size = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(size)
            faked.requests.append((self.command, self.path, time.monotonic()))
            faked.sizes.append(size)
            if faked.limit is not None and size > faked.limit:
                too_large = GatewayError("body_too_large", f"exceeds {faked.limit} bytes")
                status, headers, body = as_json(413, too_large.problem())
            else:
                status, headers, body = faked.answer(self.command, self.path)
            self.send_response(status)
            for name, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server.RequestHandlerClass = Handler
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield faked
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write_doc(tmp_path / "share", "memo.md", {"doc_id": "memo", **META}, "Memo MEMO-1.")
    return tmp_path / "share"


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "ingest.key"
    path.write_text(KEY + "\n")
    return path


def run_sync(
    url: str, key_file: Path, folder: Path, *extra: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`gateway sync`, its state under FOLDER/../state; bounded in time, so that a run
    that never ends fails the test instead of hanging it."""
    env = gateway_env(XDG_STATE_HOME=str(folder.parent / "state"))
    command = [gateway_command(), "sync", str(folder), "--url", url, "--key-file", str(key_file)]
    return subprocess.run(
        [*command, *extra], env=env, capture_output=True, text=True, timeout=timeout
    )


def failed(result: subprocess.CompletedProcess[str]) -> str:
    """The stderr of a run that failed as a user should see it: status 1, no traceback."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr


def saved_versions(folder: Path) -> list[str]:
    """The doc_ids the state remembers (none before a first step has succeeded)."""
    states = folder.parent / "state" / "gateway-sync"
    if not states.exists():
        return []
    [state] = states.iterdir()
    return [v["doc_id"] for v in json.loads(state.read_text())["versions"]]


def html(status: int, **headers: str) -> Callable[[str, str], Answer]:
    return lambda _method, _path: (status, {"Content-Type": "text/html", **headers}, HTML)


# --- what answers is not the gateway -------------------------------------------------


@pytest.mark.server
@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (html(502), "POST /admin/documents: 502, not a gateway response (text/html)"),
        (html(200), "POST /admin/documents: 200, not a gateway response (text/html)"),
        (
            lambda _m, _p: as_json(200, ["not", "a", "job"]),
            "POST /admin/documents: 200, not a gateway response (application/json)",
        ),
        (
            lambda _m, _p: as_json(202, {"status": "done"}),
            "POST /admin/documents: not a gateway's ingest job",
        ),
        (
            html(302, Location="https://admin:hunter2@login.example.com/sso?next=/"),
            "POST /admin/documents: 302 a redirect to https://login.example.com/sso?next=/, "
            "not followed",
        ),
    ],
    ids=["proxy-502", "html-200", "json-list", "no-job", "redirect"],
)
def test_an_answer_not_the_gateways_stops_the_sync_clearly(
    fake: Fake,
    key_file: Path,
    folder: Path,
    answer: Callable[[str, str], Answer],
    said: str,
) -> None:
    fake.answer = answer
    stderr = failed(run_sync(fake.url, key_file, folder))
    assert f"stopped: {said}" in stderr
    assert "hunter2" not in stderr
    assert fake.sent("POST") == ["/admin/documents"]  # not followed, not retried


@pytest.mark.server
def test_python_http_server_at_the_url_stops_the_sync_clearly(
    tmp_path: Path, key_file: Path, folder: Path
) -> None:
    """`python -m http.server` (a wrong port) answers a POST with its HTML 501 page."""
    served = tmp_path / "served"
    served.mkdir()
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = run_sync(f"http://127.0.0.1:{server.server_address[1]}", key_file, folder)
    finally:
        server.shutdown()
        server.server_close()
    stderr = failed(result)
    assert "stopped: POST /admin/documents: 501, not a gateway response (text/html)" in stderr
    assert saved_versions(folder) == []


@pytest.mark.server
def test_a_404_page_not_the_gateways_forgets_no_deleted_file(
    fake: Fake, key_file: Path, folder: Path
) -> None:
    """A 404 was taken as "already gone" whatever answered it: behind a misconfigured
    proxy, every removed file was forgotten, undeleted, and stayed readable for good. Only
    the gateway's own 404 `not_found` is "gone" now."""
    write_doc(folder, "kept.md", {"doc_id": "kept", **META}, "Kept KEPT-1.")  # not emptied
    assert run_sync(fake.url, key_file, folder).returncode == 0
    assert saved_versions(folder) == ["kept", "memo"]
    (folder / "memo.md").unlink()
    fake.answer = html(404)

    stderr = failed(run_sync(fake.url, key_file, folder))

    assert "stopped: DELETE /admin/documents/memo: 404, not a gateway response" in stderr
    assert saved_versions(folder) == ["kept", "memo"]  # still to delete on the next run
    fake.answer = lambda _m, _p: as_json(404, {"code": "not_found", "detail": "no such doc"})
    result = run_sync(fake.url, key_file, folder)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "0 sent, 0 ACL changes, 1 deleted, 1 unchanged"
    assert saved_versions(folder) == ["kept"]


# --- the state file and the key file ---------------------------------------------------


def _directory(path: Path) -> None:
    path.mkdir()


@pytest.mark.server
@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda p: p.write_text('{"format": 1, "versions": ['), "is not a state: not JSON"),
        (lambda p: p.write_text("[]"), "is not a state: a JSON list, not an object"),
        (lambda p: p.write_bytes(b'{"format": 1, "url": "\xff"}'), "not UTF-8 JSON"),
        (lambda p: p.write_text('{"format": 1, "url": "URL", "versions": 3}'), "no list"),
        (
            lambda p: p.write_text(json.dumps({"format": 1, "url": "URL", "versions": [ENTRY]})),
            "version 1 of 1 is not one",
        ),
        (_directory, "cannot read the state file"),
    ],
    ids=["truncated", "list", "not-utf8", "no-versions", "bad-version", "directory"],
)
def test_an_unreadable_state_file_stops_before_anything_is_sent_or_deleted(
    fake: Fake,
    key_file: Path,
    folder: Path,
    tmp_path: Path,
    make: Callable[[Path], object],
    why: str,
) -> None:
    """What the state lists decides the deletes: one that cannot be read is never acted
    on, and the message says which file, and what to do."""
    state = tmp_path / "kept" / "sync.json"
    state.parent.mkdir()
    make(state)
    if state.is_file():
        state.write_text(state.read_text("latin-1").replace("URL", fake.url), "latin-1")
    before = state.read_bytes() if state.is_file() else None

    for extra in ((), ("--dry-run",)):
        stderr = failed(run_sync(fake.url, key_file, folder, "--state", str(state), *extra))
        assert str(state) in stderr and why in stderr
        assert "nothing was sent. Move it away" in stderr
    assert fake.requests == []
    assert (state.read_bytes() if state.is_file() else None) == before


@pytest.mark.server
@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"\xff\xfeg\x00k\x00", "not UTF-8 text"),
        ("gk_ключ\n".encode(), "holds no API key"),
        (b"gk_one\ngk_two\n", "holds no API key"),
        (b"\n", "holds no API key"),
    ],
    ids=["utf16", "not-ascii", "two-lines", "empty"],
)
def test_a_key_file_without_a_key_fails_clearly(
    fake: Fake, folder: Path, tmp_path: Path, content: bytes, said: str
) -> None:
    key_file = tmp_path / "ingest.key"
    key_file.write_bytes(content)
    stderr = failed(run_sync(fake.url, key_file, folder))
    assert f"the key file {key_file}" in stderr and said in stderr
    assert fake.requests == []


# --- the URL ---------------------------------------------------------------------------


@pytest.mark.server
def test_a_password_in_the_url_is_never_shown_nor_sent(
    fake: Fake, key_file: Path, folder: Path
) -> None:
    """httpx sends a URL's user and password as Basic auth, in place of the key; and the
    "talking to URL" of a failed connection printed the password."""
    closed = f"http://admin:hunter2@127.0.0.1:{free_port()}"
    for url in (closed, fake.url.replace("//", "//admin:hunter2@"), f"{closed}/with/a/path"):
        result = run_sync(url, key_file, folder)
        stderr = failed(result)
        assert "hunter2" not in stderr + result.stdout
        assert "user name or password" in stderr
    assert fake.requests == []


@pytest.mark.server
def test_a_url_that_is_no_http_url_fails_clearly(key_file: Path, folder: Path) -> None:
    for url, said in (
        ("gateway.example.com:8000", "not an http(s) URL"),
        ("http://", "with a host"),
    ):
        stderr = failed(run_sync(url, key_file, folder))
        assert said in stderr


# --- a full queue (429) ----------------------------------------------------------------


def full_then_gateway(retry_after: Callable[[], str], full: int = 1) -> Callable[..., Answer]:
    """429 for the first `full` POSTs, with `Retry-After: retry_after()`; the gateway then."""
    posts: list[str] = []

    def answer(method: str, path: str) -> Answer:
        if method == "POST":
            posts.append(path)
            if len(posts) <= full:
                problem = {"code": "ingest_backlog", "detail": "the tenant's queue is full"}
                return as_json(429, problem, **{"Retry-After": retry_after()})
        return the_gateway(method, path)

    return answer


@pytest.mark.server
def test_a_retry_after_given_as_an_http_date_is_waited_out(
    fake: Fake, key_file: Path, folder: Path
) -> None:
    """RFC 9110 allows an HTTP date: it raised ValueError (`float("Wed, 21 Oct ...")`)."""
    fake.answer = full_then_gateway(lambda: email.utils.formatdate(time.time() + 2, usegmt=True))
    result = run_sync(fake.url, key_file, folder)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("1 sent")
    first, second = (at for method, _, at in fake.requests if method == "POST")
    assert second - first >= 0.9  # the date was waited for (a whole second at least)


@pytest.mark.server
def test_a_queue_that_stays_full_stops_the_sync_after_a_bounded_wait(
    fake: Fake, key_file: Path, folder: Path
) -> None:
    """429s were retried forever: now at most BACKLOG_TRIES, then a clear stop."""
    fake.answer = full_then_gateway(lambda: "0", full=10**9)
    stderr = failed(run_sync(fake.url, key_file, folder, timeout=30))
    assert "stopped: POST /admin/documents: 429 the tenant's queue is full" in stderr
    assert f"still refused after {BACKLOG_TRIES} tries" in stderr
    assert len(fake.sent("POST")) == BACKLOG_TRIES
    assert saved_versions(folder) == []


@pytest.mark.server
def test_a_retry_after_past_the_bound_stops_at_once(
    fake: Fake, key_file: Path, folder: Path
) -> None:
    fake.answer = full_then_gateway(lambda: "86400", full=10**9)
    stderr = failed(run_sync(fake.url, key_file, folder, timeout=30))
    assert "asked to wait 86400 s more" in stderr and "run again later" in stderr
    assert len(fake.sent("POST")) == 1


# --- documents with lone surrogates ------------------------------------------------------


@pytest.mark.server
def test_a_lone_surrogate_is_a_refused_document_not_a_crash(
    fake: Fake, key_file: Path, folder: Path
) -> None:
    """A JSON `\\ud800` alone in a sidecar or a JSONL line crashed httpx's encoder
    (UnicodeEncodeError) halfway through a run. The documents' parser refuses it now
    (gateway/ingest/parse.py), which sync reads the folder with: nothing is sent."""
    (folder / "note.txt").write_text("A note, NOTE-1.")
    sidecar = {**META, "doc_id": "note", "title": "half \ud800 a pair"}
    (folder / "note.txt.meta.yaml").write_text(json.dumps(sidecar))
    record = {**META, "doc_id": "line", "text": "text \ud800 with half a pair"}
    (folder / "more.jsonl").write_text(json.dumps(record) + "\n")
    write_doc(folder, "front.md", {**META, "doc_id": "front", "title": "a \udc00 b"}, "Front.")

    for extra in ((), ("--dry-run",)):
        stderr = failed(run_sync(fake.url, key_file, folder, *extra))
        assert "refused, nothing was sent" in stderr
        for source, name in (("note.txt", "title"), ("more.jsonl:1", "text"), ("front.md", "")):
            assert f"{folder / source}: {name}" in stderr and "lone surrogate" in stderr
    assert fake.requests == []


# --- the pieces, in process --------------------------------------------------------------


def test_retry_after_reads_seconds_and_http_dates() -> None:
    now = 1_700_000_000.0
    assert retry_after_s("5", now) == 5.0 and retry_after_s(" 0 ", now) == 0.0
    in_a_minute = email.utils.formatdate(now + 60, usegmt=True)
    assert retry_after_s(in_a_minute, now) == 60.0
    assert retry_after_s("Sunday, 06-Nov-94 08:49:37 GMT", now) == 0.0  # past: at once
    assert retry_after_s("Sun Nov  6 08:49:37 1994", now) == 0.0  # asctime, also RFC 9110
    for unreadable in (None, "", "soon", "-1", "1.5", "٣", "Mon, 99 Foo 2024"):
        assert retry_after_s(unreadable, now) is None


def test_a_url_is_shown_without_its_user_and_password() -> None:
    assert without_userinfo("https://a:hunter2@gw.example.com:8443/x?y=1") == (
        "https://gw.example.com:8443/x?y=1"
    )
    assert without_userinfo("http://hunter2@gw") == "http://gw"
    assert without_userinfo("http://gw/a@b") == "http://gw/a@b"
    assert "hunter2" not in without_userinfo("http://[a:hunter2@x")


def test_a_state_file_is_read_strictly(tmp_path: Path) -> None:
    path, url = tmp_path / "state.json", "http://gw"
    entry = {"doc_id": "d", "version": "1", "content": "c", "acl": ["group:a"]}
    path.write_text(json.dumps({"format": STATE_FORMAT, "url": url, "versions": [entry]}))
    assert set(StateFile(path, url).versions) == {("d", "1")}
    assert StateFile(path, "http://other").versions == {}  # another server's: not ours
    assert StateFile(tmp_path / "none.json", url).versions == {}
    for acl in ("group:a", [1], None):
        bad = {"format": STATE_FORMAT, "url": url, "versions": [{**entry, "acl": acl}]}
        path.write_text(json.dumps(bad))
        with pytest.raises(StateUnreadable, match="version 1 of 1 is not one"):
            StateFile(path, url)


@pytest.mark.server
def test_a_folder_that_lists_nothing_deletes_nothing_without_allow_empty(
    fake: Fake, key_file: Path, folder: Path
) -> None:
    """A share that is not mounted shows an empty folder: the sync planned to delete every
    document it had sent. Now it is refused, naming --allow-empty, and nothing is sent."""
    first = run_sync(fake.url, key_file, folder)
    assert first.returncode == 0, first.stderr
    assert saved_versions(folder) == ["memo"]
    (folder / "memo.md").unlink()

    for extra in ((), ("--dry-run",)):
        stderr = failed(run_sync(fake.url, key_file, folder, *extra))
        assert "lists no documents, but 1 versions were pushed from it" in stderr
        assert "run again with --allow-empty" in stderr
    assert fake.sent("DELETE") == [] and saved_versions(folder) == ["memo"]

    allowed = run_sync(fake.url, key_file, folder, "--allow-empty")
    assert allowed.returncode == 0, allowed.stderr
    assert fake.sent("DELETE") == ["/admin/documents/memo?version=1"]
    assert saved_versions(folder) == []
    again = run_sync(fake.url, key_file, folder)  # nothing known, nothing to delete: fine
    assert again.returncode == 0, again.stderr


# --- documents too large for one request ---------------------------------------------


def big_doc(folder: Path, doc_id: str, size: int, **meta: str) -> Path:
    """A Markdown document of about `size` bytes of text."""
    text = "Rule BIG-1 applies to every large file. " * (size // 40)
    return write_doc(folder, f"{doc_id}.md", {"doc_id": doc_id, **META, **meta}, text)


def test_the_connector_sends_no_more_than_the_gateway_takes() -> None:
    assert body_limit("POST", "/admin/documents") == MAX_REQUEST_BYTES


@pytest.mark.server
def test_large_documents_are_sent_in_requests_the_gateway_takes(
    fake: Fake, key_file: Path, folder: Path
) -> None:
    """Batches were cut by count only: three 12 MiB documents made one 36 MiB request,
    refused 413 by the gateway's 32 MiB limit, so the folder could never be synced. Now a
    batch is cut before its request would pass the limit."""
    fake.limit = body_limit("POST", "/admin/documents")  # the gateway's own
    for name in ("big-a", "big-b", "big-c"):
        big_doc(folder, name, 12 * 1024 * 1024)

    result = run_sync(fake.url, key_file, folder, timeout=300)

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("4 sent")
    assert max(fake.sizes) <= fake.limit
    assert len(fake.sent("POST")) == 2  # two large documents fit in one request, not three
    assert saved_versions(folder) == ["big-a", "big-b", "big-c", "memo"]


@pytest.mark.server
def test_a_document_over_the_request_limit_is_named_and_the_others_go(
    fake: Fake, key_file: Path, folder: Path
) -> None:
    """A document whose request alone is over the limit cannot be sent: it is named with
    its size and the limit, the others are sent, the run exits 1, and the version it was
    to replace is not deleted (its document would vanish); a later run tries it again."""
    limit = 4096
    fake.limit = limit
    big_doc(folder, "grows", 1000, version="1")
    assert run_sync(fake.url, key_file, folder, "--max-request-bytes", str(limit)).returncode == 0
    (folder / "grows.md").unlink()
    path = big_doc(folder, "grows", 3 * limit, version="2")
    write_doc(folder, "new.md", {"doc_id": "new", **META}, "New NEW-1.")

    for _ in range(2):
        result = run_sync(fake.url, key_file, folder, "--max-request-bytes", str(limit))
        stderr = failed(result)
        [named] = [line for line in stderr.splitlines() if line.startswith(f"! {path}")]
        size = int(named.split(" makes a request of ")[1].split()[0])
        assert size > limit and f"over the limit of {limit} bytes" in named
        assert "1 documents not sent" in stderr
        assert "BIG-1" not in stderr + result.stdout  # named, never quoted
        assert result.stdout.splitlines()[-1].startswith(("1 sent", "0 sent"))
    assert max(fake.sizes) <= limit
    assert fake.sent("DELETE") == []  # grows@1 stays until grows@2 can be sent
    assert saved_versions(folder) == ["grows", "memo", "new"]
    plan = run_sync(fake.url, key_file, folder, "--max-request-bytes", str(limit), "--dry-run")
    assert f"! {path}  not sent: grows@2 makes a request of {size} bytes" in plan.stdout
    assert plan.stdout.splitlines()[-1] == "0 to send, 0 ACL changes, 0 to delete, 2 unchanged"


# --- what a run that stopped says ----------------------------------------------------


@pytest.mark.server
def test_a_failed_acl_change_after_a_refused_batch_names_both(
    fake: Fake, key_file: Path, folder: Path
) -> None:
    """The first batch refused, then an ACL change failing: the message said only the
    ACL change's failure, and the batch's refusal (the reason its documents were not
    sent) was lost. Now both are said."""
    assert run_sync(fake.url, key_file, folder).returncode == 0
    write_doc(folder, "memo.md", {"doc_id": "memo", **META, "acl": ["group:risk"]}, "Memo MEMO-1.")
    write_doc(folder, "other.md", {"doc_id": "other", **META}, "Other OTHER-1.")

    def refusing(method: str, path: str) -> Answer:
        if method == "POST":
            return as_json(403, {"code": "outside_doc_prefix", "detail": "not under hr/"})
        return as_json(503, {"code": "catalog_unavailable", "detail": "the catalog is down"})

    fake.answer = refusing
    stderr = failed(run_sync(fake.url, key_file, folder))
    assert "POST /admin/documents: 403 not under hr/" in stderr
    assert "PUT /admin/documents/memo/acl: 503 the catalog is down" in stderr
    assert "done before stopping: 0 sent, 0 ACL changes, 0 deleted" in stderr
