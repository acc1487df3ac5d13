"""How the server speaks HTTP/1.1: uvicorn on uvloop with the httptools parser, and a bound
on the size of a request's head.

uvloop and httptools take about 1.5 ms off every request here against asyncio and h11
(a /search by document with its query vector cached: 14.7 -> 13.0 ms, measured alternately).
But where h11 refuses a head beyond its limit, httptools buffers a request line and headers
of any size: a client streaming a 400 MB header grew the server to 1.2 GB (measured). So
the protocol measures each head (exactly once it completes, by the bytes read while it
does not) and answers 431 beyond MAX_HEAD_BYTES, before the application sees anything.

Its access log keeps one line per request without the query string: a query string may
carry a person's name (`/scim/v2/Users?filter=userName eq "..."`), and logs carry IDs only
(docs/security.md, "ID-only traces").
"""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

import uvicorn
from uvicorn.config import LOGGING_CONFIG
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# Large enough for a 32 KiB bearer token plus the other headers.
MAX_HEAD_BYTES = 64 * 1024


def _problem(status: int, title: str, detail: str) -> bytes:
    """A whole problem+json response, written before any application sees the request."""
    body = json.dumps(
        {
            "type": "about:blank",
            "title": title,
            "status": status,
            "code": "http_error",
            "detail": detail,
        }  # fmt: skip
    ).encode()
    return (
        f"HTTP/1.1 {status} {title}\r\n".encode()
        + b"content-type: application/problem+json\r\n"
        + b"content-length: " + str(len(body)).encode() + b"\r\n"
        + b"connection: close\r\n\r\n" + body
    )  # fmt: skip


_TOO_LARGE = _problem(
    431,
    "Request Header Fields Too Large",
    f"the request line and headers exceed {MAX_HEAD_BYTES} bytes",
)
# What the parser refuses (a malformed header line, `Content-Length: abc`, a bad method):
# uvicorn answered it in plain text, every other error of the gateway is problem+json.
_MALFORMED = _problem(400, "Bad Request", "the request is not valid HTTP/1.1")


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a refused request."""


class BoundedHeadProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing a head over MAX_HEAD_BYTES with 431.

    A head that completes is measured exactly (its URL, header names and values); one that
    never completes by the bytes read while it is open, so an endless header is cut off
    after about MAX_HEAD_BYTES whatever it is made of."""

    _in_head = False
    _head_bytes = 0  # bytes read while this head was incomplete
    _head_size = 0  # the URL, header names and values parsed so far
    _refused = False

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes, self._head_size = True, 0, 0

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4  # ": " and the line's end
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._head_size > MAX_HEAD_BYTES:
            self._refuse()
            raise _HeadTooLarge  # the application never sees this request
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        if self._in_head and not self._refused:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refuse()

    def send_400_response(self, msg: str) -> None:
        if self._refused:  # the parser stopped because this protocol refused
            return
        self._refused = True
        self.transport.write(_MALFORMED)
        self.transport.close()

    def _refuse(self) -> None:
        self._refused = True
        self.logger.warning("request head over %d bytes refused", MAX_HEAD_BYTES)
        self.transport.write(_TOO_LARGE)
        self.transport.close()


class NoQueryStrings(logging.Filter):
    """Cuts the query string off the path of uvicorn's access log line
    ('%s - "%s %s HTTP/%s" %d': client, method, path with query, version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str):
            record.args = (args[0], args[1], args[2].split("?", 1)[0], *args[3:])
        return True


def log_config() -> dict[str, Any]:
    """uvicorn's logging, with the access log's query strings dropped, and the gateway's own
    INFO lines on standard error beside uvicorn's: without a handler of their own they
    were dropped (the numerics chosen at start, the policy reloaded, the lanes placed)."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["no_query_strings"] = {"()": NoQueryStrings}
    config["loggers"]["uvicorn.access"]["filters"] = ["no_query_strings"]
    config["loggers"]["gateway"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config


def run_server(app: Any, host: str, port: int) -> None:
    uvicorn.run(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http=BoundedHeadProtocol,
        log_config=log_config(),
    )
