"""A front proxy that serves the gateway under a path prefix, as a company's proxy may
(`https://intranet.example/rag/...` to the gateway's `/...`). It takes the prefix off each
request's path and passes the request on with its own `Host`, as a proxy that forwards it
does; it drops hop-by-hop headers and sends each body with a `Content-Length`. For tests
only; loopback only."""

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
    server: PrefixProxy
    protocol_version = "HTTP/1.1"

    def _forward(self) -> None:
        prefix, target = self.server.prefix, self.server.target
        if not (self.path == prefix or self.path.startswith((prefix + "/", prefix + "?"))):
            self.send_error(404, "outside the gateway's prefix")
            return
        if target is None:
            self.send_error(502, "no gateway to forward to yet")
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        rest = self.path[len(prefix) :]
        upstream = http.client.HTTPConnection(*target, timeout=60)
        try:
            upstream.putrequest(
                self.command, rest if rest.startswith("/") else "/" + rest, skip_host=True
            )
            for name, value in self.headers.items():  # repeated headers stay repeated
                if name.lower() not in HOP:
                    upstream.putheader(name, value)
            upstream.putheader("Content-Length", str(len(body or b"")))
            upstream.endheaders(body)
            answer = upstream.getresponse()
            data = answer.read()
        finally:
            upstream.close()
        self.send_response_only(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in HOP:
                self.send_header(name, value)
        length_sent = answer.getheader("Content-Length") if self.command == "HEAD" else None
        self.send_header("Content-Length", length_sent or str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        pass  # no line per request in the test's output


class PrefixProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, prefix: str) -> None:
        super().__init__(("127.0.0.1", 0), _Forwarding)  # bound now: no other can take it
        self.prefix = prefix
        self.target: tuple[str, int] | None = None

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def forward_to(self, gateway: str) -> None:
        parts = urlsplit(gateway)
        assert parts.hostname and parts.port
        self.target = (parts.hostname, parts.port)


@contextmanager
def prefix_proxy(prefix: str) -> Iterator[PrefixProxy]:
    """A proxy serving `<its origin><prefix>/...` from the gateway set by `forward_to`
    (502 until then), bound at once to a port of its own, until the block ends."""
    proxy = PrefixProxy(prefix)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()
        thread.join(timeout=10)
