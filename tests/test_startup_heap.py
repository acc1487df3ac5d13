"""A serving process hides what its start made from the garbage collector (gc.freeze):
the model, the libraries and the indexes live as long as the process, and a full
collection that walked them all paused a search for 170 ms (`freeze_startup_objects`).
Only `gateway serve` asks for it (its processes do not log it: the gateway's INFO lines
are not shown); an app built in a test process, which builds many, leaves the collector
as it was."""

from __future__ import annotations

import gc
from pathlib import Path

from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.embedding import Embedder
from tests.helpers.identity import TokenFactory, bearer, make_settings


def test_an_app_freezes_its_start_only_when_asked(
    data_dir: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    settings = make_settings(data_dir, jwks_file)
    ann = bearer(make_token(sub="ann", tenant="acme", groups=["staff"]))
    before = gc.get_freeze_count()  # the test process's own (tests/conftest.py)
    with TestClient(create_app(settings, embedder=embedder)):
        assert gc.get_freeze_count() <= before  # frozen objects freed go; none come
    # What this app's start made stays frozen in this test process: a one-off, and gc
    # cannot thaw part of what it froze.
    with TestClient(create_app(settings, embedder=embedder, freeze_startup=True)) as client:
        frozen = gc.get_freeze_count()
        assert frozen > before + 1000  # the app's state, its indexes, its model's objects
        found = client.post("/search", json={"query": "refund RPL-14"}, headers=ann)
        assert found.status_code == 200 and found.json()["results"]
