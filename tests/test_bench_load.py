"""The benchmark's HTTP driver says why requests failed, not only how many."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gateway.bench.load import drive


class Shedding(BaseHTTPRequestHandler):
    """Answers queries naming "shed" with a problem, "bare" with a body that is not one,
    "garbled" with a 200 that is not JSON, and others with a search result."""

    def do_POST(self) -> None:
        query = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["query"]
        if "shed" in query:
            status, body = 503, {"title": "No retrieval lane answered in time", "status": 503}
        elif "bare" in query:
            status, body = 502, ["not", "a", "problem"]
        else:
            status, body = 200, {"results": [], "degraded": [], "timings_ms": {"bm25": 1.5}}
        payload = b"<html>" if "garbled" in query else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Shedding)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_failures_are_counted_by_status_and_problem_title(server: str) -> None:
    queries = ["ok 1", "shed 1", "ok 2", "shed 2", "bare 1", "ok 3", "garbled 1"]
    phase = drive(server, "token", "/search", queries, 2)
    assert len(phase.latencies_ms) == 7 and phase.errors == 4
    assert phase.failures == {
        "503 No retrieval lane answered in time": 2,
        "502": 1,
        "200 unreadable": 1,  # counted, not a crash of the whole run
    }
    assert phase.stages_ms == {"bm25": [1.5, 1.5, 1.5]}  # only the answered ones


def test_a_server_that_is_gone_is_no_response() -> None:
    # A port held but not listened on: connecting is refused, and no other process can
    # take the port meanwhile (as it could one freed and asked for again).
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        phase = drive(f"http://127.0.0.1:{port}", "token", "/search", ["ok", "ok"], 1)
    assert phase.errors == 2 and phase.failures == {"no response (ConnectionRefusedError)": 2}
