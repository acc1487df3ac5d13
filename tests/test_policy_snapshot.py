"""A policy reload never mixes two policies: not in what `GET /admin/policy` reports, and
not within one request, which is decided from start to end by the policy it was
authorised under (gateway/policy/store.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import create_app
from gateway.authn.apikeys import create_key
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.policy.store import PolicyStore
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ROOT
from tests.helpers.documents import doc, write_corpus
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.policies import write_policy


class AskDuringTheReload(logging.Handler):
    """Asks `GET /admin/policy` from inside a reload, as it logs that a new policy replaces
    the old: a reader meeting the reload in the middle, made certain instead of lucky."""

    def __init__(self, ask: Callable[[], dict[str, Any]]) -> None:
        super().__init__()
        self.ask = ask
        self.answers: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "replaces" in record.getMessage():
            self.answers.append(self.ask())


def test_the_policy_state_is_one_load_while_a_reload_runs(
    tmp_path: Path,
    data_dir: Path,
    jwks_file: Path,
    embedder: Embedder,
    make_token: TokenFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy_dir = write_policy(tmp_path / "policy")
    settings = make_settings(data_dir, jwks_file, policy_dir).model_copy(
        update={"policy_watch_interval_s": 0.0}
    )
    with TestClient(create_app(settings, embedder=embedder)) as client:
        store: PolicyStore = client.app.state.gateway.policies  # type: ignore[attr-defined]
        operator = bearer(make_token(**ROOT))

        def ask() -> dict[str, Any]:
            answer = client.get("/admin/policy", headers=operator)
            assert answer.status_code == 200, answer.text
            return dict(answer.json())

        answers = [ask()]
        during = AskDuringTheReload(ask)
        caplog.set_level(logging.INFO, logger="gateway.policy")
        logging.getLogger("gateway.policy").addHandler(during)
        try:
            for rrf_k in (61, 62):
                write_policy(policy_dir, retrieval={"candidates_per_lane": 40, "rrf_k": rrf_k})
                # As the file watcher and SIGHUP do: on a thread other than the server's loop.
                assert store.reload().outcome == "loaded"
                answers.append(ask())
        finally:
            logging.getLogger("gateway.policy").removeHandler(during)

    assert len(during.answers) == 2 and len({a["version"] for a in answers}) == 3
    for answer in [*during.answers, *answers]:
        last = answer["last_reload"]
        # The last reload named is the one that loaded the version reported, at its time.
        assert last is None or (last["version"], last["at"]) == (
            answer["version"],
            answer["loaded_at"],
        ), answer


@pytest.fixture
def pushing(
    tmp_path: Path, embedder: Embedder, jwks_file: Path
) -> Iterator[tuple[TestClient, Path, str]]:
    """A server without its writer (a job stays queued), its policy directory, an ingest
    key of acme."""
    layout = DataLayout(tmp_path / "data")
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    policy_dir = write_policy(tmp_path / "policy", ingest={"max_pending_jobs": 5})
    settings = make_settings(layout.root, jwks_file, policy_dir).model_copy(
        update={"policy_watch_interval_s": 0.0}
    )
    key, _ = create_key(
        layout.open_catalog(), tenant="acme", region="EU", principals=[], scope="ingest"
    )
    with TestClient(create_app(settings, embedder=embedder)) as client:
        yield client, policy_dir, key


def test_a_push_is_bounded_by_the_policy_it_was_authorised_under(
    pushing: tuple[TestClient, Path, str],
) -> None:
    client, policy_dir, key = pushing
    store: PolicyStore = client.app.state.gateway.policies  # type: ignore[attr-defined]
    first = client.post("/admin/documents", json={"documents": [doc("a")]}, headers=bearer(key))
    assert first.status_code == 202, first.text  # one job queued: under 5, over 1
    authorised_under = store.current.version

    def body_sent_after_a_reload() -> Iterator[bytes]:
        # The server authenticates the caller from the headers, then reads the body: the
        # reload lands between the two, as one the watcher makes during an upload does.
        write_policy(policy_dir, ingest={"max_pending_jobs": 1})
        assert store.reload().outcome == "loaded"
        yield json.dumps({"documents": [doc("b")]}).encode()

    during = client.post(
        "/admin/documents",
        content=body_sent_after_a_reload(),
        headers={**bearer(key), "content-type": "application/json"},
    )
    assert store.current.version != authorised_under
    assert during.status_code == 202, during.text  # decided by its own policy, as audited

    after = client.post("/admin/documents", json={"documents": [doc("c")]}, headers=bearer(key))
    assert after.status_code == 429, after.text  # the next request is decided by the new one
    assert "ingest.max_pending_jobs is 1" in after.json()["detail"]
