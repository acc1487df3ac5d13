"""A throwaway PostgreSQL cluster on loopback for tests, from the server binaries installed
on the machine (Debian's `postgresql-15` here). PostgreSQL refuses to run as root, so as
root the cluster is created and run by the `postgres` user, in a temporary directory."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from gateway.bench.server import free_port


def server_binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))  # Debian's layout
    initdb = found[-1] if found else shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@dataclass
class Cluster:
    bin: Path
    directory: Path
    port: int

    def _run(self, *command: str) -> None:
        as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*as_owner, *command], check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        options = f"-k {self.directory} -p {self.port} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.directory / "data"),
            "-l", str(self.directory / "log"), "-w", "-o", options, "start",
        )  # fmt: skip

    def stop(self) -> None:
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.directory / "data"), "-m", "fast", "-w", "stop"
        )

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def new_database(self) -> str:
        """A fresh, empty database; its SQLAlchemy URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}")
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"


@contextmanager
def throwaway_cluster() -> Iterator[Cluster]:
    binaries = server_binaries()
    if binaries is None:
        pytest.skip("PostgreSQL's server binaries (initdb, pg_ctl) are not installed")
    directory = Path(tempfile.mkdtemp(prefix="gateway-pg-"))
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres", "postgres")
    cluster = Cluster(binaries, directory, free_port())
    cluster._run(
        str(binaries / "initdb"), "-D", str(directory / "data"),
        "-A", "trust", "-U", "postgres", "--no-sync",
    )  # fmt: skip
    cluster.start()
    try:
        yield cluster
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):  # a test may have stopped it
            cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)
