"""A `gateway serve` with its writer over a seeded data dir, and an ingest key of tenant
acme written to a file: what the `gateway sync` tests run the connector against."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gateway.authn.apikeys import create_key
from gateway.embedding import Embedder
from gateway.storage.layout import DataLayout
from tests.helpers.documents import seed
from tests.helpers.identity import AUDIENCE, ISSUER
from tests.helpers.processes import gateway_env, running_server


@contextmanager
def sync_server(
    root: Path, embedder: Embedder, jwks_file: Path
) -> Iterator[tuple[str, DataLayout, Path]]:
    """(base URL, the data dir, the key's file); `seed`'s documents, not pushed by the key."""
    layout = seed(root, embedder)
    key, _ = create_key(
        layout.open_catalog(), tenant="acme", region="EU", principals=[], scope="ingest"
    )
    key_file = root / "ingest.key"
    key_file.write_text(key + "\n")
    env = gateway_env(
        GATEWAY_DATA_DIR=str(layout.root),
        GATEWAY_OIDC_ISSUER=ISSUER,
        GATEWAY_OIDC_AUDIENCE=AUDIENCE,
        GATEWAY_JWKS_URI=jwks_file.as_uri(),
    )
    with running_server(env, worker=True) as (base, _process):
        yield base, layout, key_file
