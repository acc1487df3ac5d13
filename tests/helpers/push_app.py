"""An app that takes pushes (POST /admin/documents), with the writer the test runs itself."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.authn.apikeys import create_key
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.ingest.worker import IngestWorker
from gateway.policy.loader import load_policy
from gateway.settings import Settings
from gateway.storage.layout import DataLayout
from tests.helpers.documents import write_corpus
from tests.helpers.identity import make_settings
from tests.helpers.policies import write_policy


class Deployment(NamedTuple):
    layout: DataLayout  # holding the test corpus
    settings: Settings
    policy_dir: Path


def deployment(
    tmp_path: Path,
    embedder: Embedder,
    jwks_file: Path,
    database_url: str | None = None,
    **policy_changes: Any,
) -> Deployment:
    """A data dir holding the test corpus (its catalog at `database_url`, e.g. a test
    PostgreSQL's, or SQLite in the data dir), `write_policy`'s policy with
    `policy_changes`, and the settings an app serves them with."""
    layout = DataLayout(tmp_path / "data", database_url or "")
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    policy_dir = write_policy(tmp_path / "policy", **policy_changes)
    settings = make_settings(layout.root, jwks_file, policy_dir)
    if database_url is not None:
        settings = settings.model_copy(update={"database_url": database_url})
    return Deployment(layout, settings, policy_dir)


class PushApp(NamedTuple):
    client: TestClient
    writer: IngestWorker  # its data dir is `writer.layout`
    key: str  # an ingest key for acme, EU


@contextmanager
def push_app(
    tmp_path: Path,
    embedder: Embedder,
    jwks_file: Path,
    raise_server_exceptions: bool = True,
    **policy_changes: Any,
) -> Iterator[PushApp]:
    """A started app on a data dir holding the test corpus, under `write_policy`'s policy
    with `policy_changes`. The app runs no writer: a pushed job waits until the test calls
    `writer.run_once()` (or `writer.run`)."""
    layout, settings, policy_dir = deployment(tmp_path, embedder, jwks_file, **policy_changes)
    key, _ = create_key(
        layout.open_catalog(), tenant="acme", region="EU", principals=[], scope="ingest"
    )
    writer = IngestWorker(layout, embedder, lambda: load_policy(policy_dir).policy)
    app = create_app(settings, embedder=embedder)
    with TestClient(app, raise_server_exceptions=raise_server_exceptions) as client:
        yield PushApp(client, writer, key)
