"""A policy reload applies to every knob it names from the next request on.

Only the lane pool sizes (`budgets.workers_per_lane`, `max_abandoned_per_lane`) are fixed
for the life of a process. The knobs below were read once at startup before: a reload
changed the reported policy version while the lanes kept the old values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.api.app import create_app
from gateway.embedding import Embedder
from gateway.policy.store import PolicyStore
from tests.helpers.callers import ROOT
from tests.helpers.documents import ingest_ann_notes
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.policies import write_policy


def stage_attributes(spans: InMemorySpanExporter, name: str) -> dict[str, Any]:
    found = [s for s in spans.get_finished_spans() if s.name == name]
    return dict(found[-1].attributes or {})


def test_retrieval_and_rerank_knobs_follow_a_reload(
    tmp_path: Path,
    embedder: Embedder,
    jwks_file: Path,
    cross_encoder_dir: Path,  # noqa: F811
    make_token: TokenFactory,
) -> None:
    layout = ingest_ann_notes(tmp_path, embedder)
    policy_dir = write_policy(tmp_path / "policy")
    settings = make_settings(layout.root, jwks_file, policy_dir).model_copy(
        update={"policy_watch_interval_s": 0.0, "rerank_model": cross_encoder_dir}
    )
    spans = InMemorySpanExporter()
    ask = {"query": "refund rules", "top_k": 5}
    with TestClient(create_app(settings, embedder=embedder, span_exporter=spans)) as client:
        caller = bearer(make_token())
        assert client.post("/answer", json=ask, headers=caller).status_code == 200
        before = stage_attributes(spans, "dense")
        assert before["engine"] == "flat"  # 300 rows, far under flat_search_max_rows
        assert stage_attributes(spans, "rerank")["rerank_candidates"] == 20

        policy = yaml.safe_load((policy_dir / "policy.yaml").read_text())
        policy["retrieval"].update(
            flat_search_max_rows=0, ann_nprobes=8, ann_refine_factor=2, rerank_candidates=3
        )
        (policy_dir / "policy.yaml").write_text(yaml.safe_dump(policy))
        reloaded = client.post("/admin/policy/reload", headers=bearer(make_token(**ROOT)))
        assert reloaded.status_code == 200, reloaded.text

        answered = client.post("/answer", json=ask, headers=caller)
        assert answered.json()["policy_version"] == reloaded.json()["version"]
        after = stage_attributes(spans, "dense")
        assert after["engine"] == "lancedb_ann"
        assert (after["nprobes"], after["refine_factor"]) == (8, 2)
        assert stage_attributes(spans, "rerank")["rerank_candidates"] == 3


def test_the_watcher_never_loads_a_policy_file_seen_mid_write(tmp_path: Path) -> None:
    directory = write_policy(tmp_path / "policy")
    now = [0.0]
    store = PolicyStore(directory, settle_s=1.0, clock=lambda: now[0])
    served = store.current.version
    policy_file = directory / "policy.yaml"
    whole = policy_file.read_text()

    policy_file.write_text("")  # truncated by an editor (refused, were it to stay so)
    assert store.reload_if_changed() is None  # just changed: not yet
    assert store.reload_if_changed() is None  # a second look at once (the writer's): not yet
    now[0] += 0.5
    policy_file.write_text(whole.replace("rrf_k: 60", "rrf_k: 61"))  # the write completes
    assert store.reload_if_changed() is None
    now[0] += 0.9
    assert store.reload_if_changed() is None  # the same for 0.9 s only
    assert store.current.version == served and store.current.policy.admins.groups

    now[0] += 0.2  # the same for a second: loaded
    outcome = store.reload_if_changed()
    assert outcome is not None and outcome.outcome == "loaded"
    assert store.current.policy.retrieval.rrf_k == 61 and store.current.policy.admins.groups
    assert store.reload_if_changed() is None  # nothing new


def test_a_policy_file_emptied_for_good_is_refused_and_the_served_policy_stays(
    tmp_path: Path,
) -> None:
    directory = write_policy(tmp_path / "policy")
    now = [0.0]
    store = PolicyStore(directory, settle_s=1.0, clock=lambda: now[0])
    served = store.current
    (directory / "policy.yaml").write_text("")  # a deploy that wrote nothing
    assert store.reload_if_changed() is None
    now[0] += 1.1  # it settled: not a write in progress
    outcome = store.reload_if_changed()
    assert outcome is not None and outcome.outcome == "refused"
    assert "policy.yaml: empty" in outcome.problems
    assert store.current.version == served.version
    assert store.current.policy.admins.groups == served.policy.admins.groups
