"""`gateway serve` as a real process on loopback: readiness, search, big and endless headers."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.api.protocol import MAX_HEAD_BYTES
from gateway.bench.server import memory_mb
from gateway.embedding import Embedder
from gateway.embedding.onnx_query import enable_fast_queries
from gateway.policy.loader import DEFAULT_POLICY_DIR
from tests.helpers.identity import AUDIENCE, ISSUER, TokenFactory, bearer
from tests.helpers.processes import gateway_env, running_server

pytestmark = pytest.mark.server

ADMIN = {"sub": "root", "groups": []}


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("served-policy")
    policy = yaml.safe_load((DEFAULT_POLICY_DIR / "policy.yaml").read_text())
    policy["operators"] = {"tenant": "acme", "subjects": ["root"]}  # reads the policy
    (directory / "policy.yaml").write_text(yaml.safe_dump(policy))
    return directory


@pytest.fixture(scope="module")
def server(
    data_dir: Path, jwks_file: Path, policy_dir: Path, embedder: Embedder
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    # The query encoder exported beforehand, as by any earlier start of the server.
    attached = embedder.fast_queries
    assert enable_fast_queries(embedder, data_dir / "models")
    if not attached:
        embedder.use_fast_queries(None)
    env = gateway_env(
        GATEWAY_DATA_DIR=str(data_dir),
        GATEWAY_MODEL_CACHE_DIR=str(data_dir / "models"),
        GATEWAY_POLICY_DIR=str(policy_dir),
        GATEWAY_POLICY_WATCH_INTERVAL_S="0",  # only SIGHUP may reload here
        GATEWAY_OIDC_ISSUER=ISSUER,
        GATEWAY_OIDC_AUDIENCE=AUDIENCE,
        GATEWAY_JWKS_URI=jwks_file.as_uri(),
    )
    with running_server(env) as started:
        yield started


def test_search_over_real_http(
    server: tuple[str, subprocess.Popen[bytes]], make_token: TokenFactory
) -> None:
    response = httpx.post(
        f"{server[0]}/search", json={"query": "RPL-14"}, headers=bearer(make_token()), timeout=30
    )
    assert response.status_code == 200
    assert response.json()["results"][0]["doc_id"] == "refund-policy"


def test_a_server_with_its_query_encoder_exported_never_loads_torch(
    server: tuple[str, subprocess.Popen[bytes]], make_token: TokenFactory
) -> None:
    for path in ("/search", "/answer"):
        response = httpx.post(
            f"{server[0]}{path}", json={"query": "How fast are EU refunds paid?"},
            headers=bearer(make_token()), timeout=30,
        )  # fmt: skip
        assert response.status_code == 200
    libraries = Path(f"/proc/{server[1].pid}/maps").read_text()
    assert "onnxruntime" in libraries and "libtorch" not in libraries


def test_a_32_kib_token_reaches_authentication(server: tuple[str, subprocess.Popen[bytes]]) -> None:
    response = httpx.post(
        f"{server[0]}/search", json={"query": "x"}, headers=bearer("a" * 32 * 1024), timeout=30
    )
    assert response.status_code == 401


def _head_then_read(base: str, head: bytes) -> bytes:
    """Send the bytes of a request (or of a head no blank line ends), then read the reply."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(head)
        return connection.recv(4096)


def test_a_request_head_over_64_kib_is_refused_with_431(
    server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    start = b"POST /search HTTP/1.1\r\nHost: gateway\r\nX-Padding: "
    reply = _head_then_read(server[0], start + b"a" * (MAX_HEAD_BYTES + 1024))
    status, _, rest = reply.partition(b"\r\n")
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large"
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert b"content-type: application/problem+json" in headers
    assert json.loads(body)["status"] == 431


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nno colon here\r\n\r\n",
        b"POST /search HTTP/1.1\r\nHost: gateway\r\nContent-Length: abc\r\n\r\n",
        b"G(T /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n",
    ],
    ids=["header line", "content length", "method"],
)
def test_what_is_not_http_is_a_problem_400(
    server: tuple[str, subprocess.Popen[bytes]], request_bytes: bytes
) -> None:
    """uvicorn answered these "Invalid HTTP request received." in plain text."""
    status, _, rest = _head_then_read(server[0], request_bytes).partition(b"\r\n")
    assert status == b"HTTP/1.1 400 Bad Request"
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert b"content-type: application/problem+json" in headers
    assert json.loads(body)["status"] == 400


@pytest.mark.parametrize("headers", [1, 40], ids=["one large header", "many headers"])
def test_a_complete_request_with_a_head_over_64_kib_is_refused_with_431(
    server: tuple[str, subprocess.Popen[bytes]], headers: int
) -> None:
    """Whole heads, as a client sends them in one write: the application never sees them."""
    size = MAX_HEAD_BYTES // headers + 64
    lines = b"".join(b"X-Padding-%d: %s\r\n" % (n, b"a" * size) for n in range(headers))
    body = b'{"query": "refund"}'
    request = (
        b"POST /search HTTP/1.1\r\nHost: gateway\r\n" + lines + b"content-type: "
        b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )
    status = _head_then_read(server[0], request).partition(b"\r\n")[0]
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large"


def test_an_endless_header_is_cut_off_without_growing_the_server(
    server: tuple[str, subprocess.Popen[bytes]], make_token: TokenFactory
) -> None:
    """httptools alone would buffer all of it (a 400 MB header took 1.2 GB, measured)."""
    base, process = server
    host, port = base.removeprefix("http://").split(":")
    before = memory_mb(process.pid)["rss"]
    sent_mb = 0
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Endless: ")
        with pytest.raises(OSError):  # the server closes the connection: the sends fail
            while sent_mb < 256:
                connection.sendall(b"a" * (1 << 20))
                sent_mb += 1
    assert sent_mb < 16  # cut off after the first 64 KiB (plus what the kernels buffered)
    assert memory_mb(process.pid)["rss"] - before < 32
    response = httpx.post(
        f"{base}/search", json={"query": "refund"}, headers=bearer(make_token()), timeout=30
    )
    assert response.status_code == 200


def test_sighup_reloads_the_policy_without_a_restart(
    server: tuple[str, subprocess.Popen[bytes]], policy_dir: Path, make_token: TokenFactory
) -> None:
    base, process = server
    admin = bearer(make_token(**ADMIN))
    before = httpx.get(f"{base}/admin/policy", headers=admin, timeout=30).json()["version"]
    policy = policy_dir / "policy.yaml"
    policy.write_text(policy.read_text().replace("bm25_ms: 300", "bm25_ms: 350"))
    process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    after = before
    while after == before and time.monotonic() < deadline:
        time.sleep(0.2)
        after = httpx.get(f"{base}/admin/policy", headers=admin, timeout=30).json()["version"]
    assert after != before
    searched = httpx.post(f"{base}/search", json={"query": "refund"}, headers=admin, timeout=30)
    assert searched.json()["policy_version"] == after
    assert searched.headers["gateway-policy-version"] == after
    assert process.poll() is None  # reloaded, not restarted
