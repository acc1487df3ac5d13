"""Strangers cost nothing: bodies are bounded and a request without valid credentials is
answered before its body is read, against a real `gateway serve` process.

Before, a 128 MiB JSON body sent without a token to /answer grew the server by about
384 MiB before the 401 came back, and malformed JSON without a token got a 422.

The ACL route's limit fits its schema: before, an ACL of more than about 3,000 principals
(which a push accepts, up to 10,000) could not be set again, its PUT being 413.
"""

from __future__ import annotations

import json
import select
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.api.limits import ACL_LIMIT
from gateway.bench.server import memory_mb
from gateway.embedding import Embedder
from tests.helpers.callers import ALICE
from tests.helpers.documents import doc
from tests.helpers.identity import AUDIENCE, ISSUER, TokenFactory, bearer
from tests.helpers.processes import gateway_env, running_server
from tests.helpers.push_app import push_app

pytestmark = pytest.mark.server

GIB = 1024**3
JSON = {"content-type": "application/json"}
PIECE_SIZE = 1024 * 1024
PIECE = b"{" + b" " * (PIECE_SIZE - 1)  # 1 MiB of a JSON body that never ends


@pytest.fixture(scope="module")
def server(
    data_dir: Path, jwks_file: Path, embedder: Embedder
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    env = gateway_env(
        GATEWAY_DATA_DIR=str(data_dir),
        GATEWAY_OIDC_ISSUER=ISSUER,
        GATEWAY_OIDC_AUDIENCE=AUDIENCE,
        GATEWAY_JWKS_URI=jwks_file.as_uri(),
        GATEWAY_POLICY_WATCH_INTERVAL_S="0",
    )
    with running_server(env) as started:
        yield started


def flood(
    base: str, chunked: bool, token: str = "", total: int = GIB, target: str = "POST /answer"
) -> int:
    """Send a `total`-byte body to `target` (/answer) a MiB at a time, reading the server's
    answer as soon as it comes; then go on sending until it closes the connection, and
    return the status it answered with."""
    host, port = base.removeprefix("http://").split(":")
    head = [f"{target} HTTP/1.1", f"Host: {host}", "Content-Type: application/json"]
    head += [f"Authorization: Bearer {token}"] if token else []
    head += ["Transfer-Encoding: chunked"] if chunked else [f"Content-Length: {total}"]
    frame = (b"%x\r\n" % len(PIECE)) + PIECE + b"\r\n" if chunked else PIECE
    status, sent = 0, 0
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        wait = 1.0  # an answer that needs no body comes right after the head
        while sent < total and not status:
            readable = select.select([connection], [], [], wait)[0]
            wait = 0.0
            if not readable:
                try:
                    connection.sendall(frame)
                    sent += len(PIECE)
                    continue
                except OSError:
                    pass  # refused mid-body: the answer is already in our receive queue
            status = int(connection.recv(4096).split(b" ", 2)[1])
        try:
            while sent < total:
                connection.sendall(frame)
                sent += len(PIECE)
        except OSError:
            pass  # closed by the server, as it should: the rest is never read
    if total >= 64 * PIECE_SIZE:
        assert sent < total // 4, "the server kept reading a refused body"
    return status


def test_gigabyte_bodies_without_a_token_cost_the_server_nothing(
    server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    base, process = server
    httpx.get(f"{base}/healthz", timeout=10)
    before = memory_mb(process.pid)["rss"]
    statuses: list[int] = []
    threads = [
        threading.Thread(target=lambda c=chunked: statuses.append(flood(base, c)))
        for chunked in (False, True, False, True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    after = memory_mb(process.pid)["rss"]
    # A declared 1 GiB is refused by its Content-Length; a chunked one by its missing token.
    assert sorted(statuses) == [401, 401, 413, 413]
    assert after - before < 16, f"RSS grew {after - before:.1f} MB"


def test_an_authenticated_body_over_the_limit_is_refused_unread(
    server: tuple[str, subprocess.Popen[bytes]], make_token: TokenFactory
) -> None:
    base, _ = server
    token = make_token()
    assert flood(base, chunked=True, token=token, total=256 * 1024 * 1024) == 413
    assert flood(base, chunked=False, token=token, total=70 * 1024) == 413
    padded = {"query": "refunds", "top_k": 3, "padding": "x" * (70 * 1024)}
    refused = httpx.post(f"{base}/search", json=padded, headers=bearer(token), timeout=30)
    assert refused.status_code == 413 and refused.json()["code"] == "body_too_large"


def test_credentials_are_checked_before_a_body_is_parsed(
    server: tuple[str, subprocess.Popen[bytes]], make_token: TokenFactory
) -> None:
    base, _ = server
    broken = b'{"query": "refunds", '
    for path in ("/search", "/answer"):
        anonymous = httpx.post(f"{base}{path}", content=broken, timeout=30)
        assert anonymous.status_code == 401, anonymous.text
        assert anonymous.json()["code"] == "unauthenticated"
        assert anonymous.headers["www-authenticate"] == "Bearer"
        forged = httpx.post(
            f"{base}{path}", content=broken, headers=bearer("not.a.token"), timeout=30
        )
        assert forged.status_code == 401
        signed = httpx.post(f"{base}{path}", content=broken, headers=bearer(make_token()))
        assert signed.status_code == 422  # a caller with a valid token learns what is wrong
    fine = httpx.post(
        f"{base}/search",
        content=json.dumps({"query": "refunds"}),
        headers=JSON | bearer(make_token()),
    )
    assert fine.status_code == 200


def test_an_acl_change_as_large_as_its_schema_allows_fits_the_body_limit(
    server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    base, _ = server
    target = "PUT /admin/documents/policies/refunds.md/acl"  # a doc_id may hold '/'
    # At the limit the body is allowed, so the caller is asked for credentials; one byte
    # over, the declared length alone is refused, before credentials or body are read.
    assert flood(base, chunked=False, total=ACL_LIMIT, target=target) == 401
    assert flood(base, chunked=False, total=ACL_LIMIT + 1, target=target) == 413
    # Only that route: a body of the same size anywhere else is over its own limit.
    other = "PUT /admin/documents/policies/refunds.md/acl/x"
    assert flood(base, chunked=False, total=ACL_LIMIT, target=other) == 413


def test_an_acl_of_10000_principals_can_be_set_again(
    tmp_path: Path, embedder: Embedder, jwks_file: Path, make_token: TokenFactory
) -> None:
    others = [f"group:project-team-{n:05d}" for n in range(9_999)]
    with push_app(tmp_path, embedder, jwks_file) as (client, writer, key):
        pushed = client.post(
            "/admin/documents",
            json={"documents": [doc("pelican-wide", acl=[*others, "group:finance"])]},
            headers=bearer(key),
        )
        assert pushed.status_code == 202, pushed.text
        assert writer.run_once() == 1
        body = {"acl": [*others, "group:staff"]}  # staff (alice) instead of finance
        assert len(json.dumps(body)) > 4 * 64 * 1024
        changed = client.put("/admin/documents/pelican-wide/acl", json=body, headers=bearer(key))
        assert changed.status_code == 200, changed.text
        assert changed.json()["versions"] == 1
        found = client.post(
            "/search",
            json={"query": "pelican quota", "group_by": "document"},
            headers=bearer(make_token(**ALICE)),
        )
        assert found.status_code == 200, found.text
        assert "pelican-wide" in {r["doc_id"] for r in found.json()["results"]}
