"""A front proxy that serves the gateway under a path prefix, as a company's proxy may
(`https://intranet.example/rag/...` to the gateway's `/...`): the prefix is taken off each
request's path and nothing else is changed. For tests only; loopback only."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# Hop-by-hop headers (RFC 9110, 7.6.1), and the length, which this proxy sets itself.
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "content-length"}


class _Forwarding(BaseHTTPRequestHandler):
    server: _PrefixProxy
    protocol_version = "HTTP/1.1"

    def _forward(self) -> None:
        prefix = self.server.prefix
        if not (self.path == prefix or self.path.startswith((prefix + "/", prefix + "?"))):
            self.send_error(404, "outside the gateway's prefix")
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        sent = {k: v for k, v in self.headers.items() if k.lower() not in HOP | {"host"}}
        upstream = http.client.HTTPConnection(*self.server.target, timeout=60)
        try:
            upstream.request(self.command, self.path[len(prefix) :] or "/", body, sent)
            answer = upstream.getresponse()
            data = answer.read()
        finally:
            upstream.close()
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in HOP | {"server", "date"}:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass  # no line per request in the test's output


class _PrefixProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, prefix: str, target: tuple[str, int]) -> None:
        super().__init__(("127.0.0.1", port), _Forwarding)
        self.prefix, self.target = prefix, target


@contextmanager
def prefix_proxy(port: int, prefix: str, gateway: str) -> Iterator[str]:
    """`http://127.0.0.1:<port><prefix>/...` answered by the gateway at `gateway`'s `/...`,
    until the block ends; yields the proxy's origin."""
    parts = urlsplit(gateway)
    assert parts.hostname and parts.port
    proxy = _PrefixProxy(port, prefix, (parts.hostname, parts.port))
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proxy.shutdown()
        proxy.server_close()
        thread.join(timeout=10)
