"""Erasure against real processes on the embedded topology: `gateway serve`'s writer erases
what `DELETE /admin/documents/{doc_id}` removed within the policy's erase_within_s, and
`gateway erase --tenant T --wait` does it at once while `serve` runs; a process killed with
-9 in the middle of an erasure leaves it to be finished by the next; `gateway tenant
delete` removes a tenant and erases it. Each ends with the canary scans finding nothing
while everything else still answers."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from gateway.authn.apikeys import create_key
from gateway.bench.server import gateway_command
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.storage.directory_tables import UserFields
from gateway.storage.erasures import WRITTEN
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ALICE
from tests.helpers.canary import canary_doc, canary_vectors, scan
from tests.helpers.documents import write_corpus
from tests.helpers.identity import AUDIENCE, ISSUER, TokenFactory, bearer
from tests.helpers.policies import write_policy
from tests.helpers.processes import gateway_env, run_gateway, running_server

pytestmark = [pytest.mark.server, pytest.mark.sleeps, pytest.mark.long]


def _setup(tmp_path: Path, embedder: Embedder, jwks_file: Path, erase_within_s: int):
    layout = DataLayout(tmp_path / "data")
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    policy = write_policy(tmp_path / "policy", retention={"erase_within_s": erase_within_s})
    env = gateway_env(
        GATEWAY_DATA_DIR=str(layout.root),
        GATEWAY_POLICY_DIR=str(policy),
        GATEWAY_OIDC_ISSUER=ISSUER,
        GATEWAY_OIDC_AUDIENCE=AUDIENCE,
        GATEWAY_JWKS_URI=jwks_file.as_uri(),
    )
    key, _ = create_key(
        layout.open_catalog(), tenant="acme", region="EU", principals=[], scope="ingest"
    )
    return layout, env, bearer(key)


def _push(client: httpx.Client, ingest: dict[str, str], numbers: range) -> list[str]:
    batch = {"documents": [canary_doc(n) for n in numbers]}
    pushed = client.post("/admin/documents?wait=true", json=batch, headers=ingest)
    assert pushed.status_code == 200 and pushed.json()["status"] == "succeeded", pushed.text
    return [d["doc_id"] for d in batch["documents"]]


def _delete(client: httpx.Client, ingest: dict[str, str], ids: list[str]) -> None:
    for doc_id in ids:
        assert client.delete(f"/admin/documents/{doc_id}", headers=ingest).status_code == 200


def _still_answers(client: httpx.Client, alice: dict[str, str]) -> int:
    found = client.post("/search", json={"query": "refunds paid"}, headers=alice)
    assert found.status_code == 200, found.text
    body = found.json()
    assert body["results"] and not any(r["doc_id"].startswith("canary") for r in body["results"])
    return int(body["index_generation"])


def test_serve_erases_deletes_on_its_own_and_gateway_erase_at_once(
    tmp_path: Path, embedder: Embedder, jwks_file: Path, make_token: TokenFactory
) -> None:
    layout, env, ingest = _setup(tmp_path, embedder, jwks_file, erase_within_s=4)
    alice = bearer(make_token(**ALICE, ttl=900))
    catalog = layout.open_catalog()
    with (
        running_server(env, worker=True) as (base, _),
        httpx.Client(base_url=base, timeout=120) as client,
    ):
        ids = _push(client, ingest, range(3))
        vectors = canary_vectors(str(layout.vectors), None, ids)
        _delete(client, ingest, ids)
        deadline = time.monotonic() + 30  # erase_within_s, and time to spare on 2 cores
        while catalog.erasures.open():
            assert time.monotonic() < deadline, "the writer did not erase in time"
            time.sleep(0.2)
        found = scan(layout.root, ids, vectors)
        assert found.empty, found
        _still_answers(client, alice)

        more = _push(client, ingest, range(5, 7))
        vectors = canary_vectors(str(layout.vectors), None, more)
        _delete(client, ingest, more)
        done = run_gateway("erase", "--tenant", "acme", "--wait", env=env)
        assert done.returncode == 0, done.stderr
        assert "erased through generation" in done.stdout and "kept:" in done.stdout
        assert "0 handed-over slice(s) cleared" in done.stdout  # no embedder ran
        found = scan(layout.root, more, vectors)
        assert found.empty, found
        assert _still_answers(client, alice) >= (catalog.current_generation_id() or 0)


def _erase_process(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [gateway_command(), "erase", "--tenant", "acme", "--wait"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("moment", ["while writing", "while waiting for a replica"])
def test_an_erasure_killed_in_the_middle_is_finished_by_the_next(
    tmp_path: Path, embedder: Embedder, jwks_file: Path, make_token: TokenFactory, moment: str
) -> None:
    layout, env, ingest = _setup(tmp_path, embedder, jwks_file, erase_within_s=3600)
    alice = bearer(make_token(**ALICE, ttl=900))
    catalog = layout.open_catalog()
    with (
        running_server(env, worker=True) as (base, _),
        httpx.Client(base_url=base, timeout=120) as client,
    ):
        ids = _push(client, ingest, range(4))
        vectors = canary_vectors(str(layout.vectors), None, ids)
        _delete(client, ingest, ids)
        current = catalog.current_generation_id() or 0
        if moment == "while waiting for a replica":  # one that still serves the generation before
            catalog.replicas.report(current)
        process = _erase_process(env)
        deadline = time.monotonic() + 60
        if moment == "while writing":  # the erasure generation's directory is being made
            while not layout.lexical(current + 1).exists():
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.005)
        else:
            while not any(r.status == WRITTEN for r in catalog.erasures.open()):
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.05)
                catalog.replicas.report(current)  # still there, still behind
        process.send_signal(signal.SIGKILL)
        process.wait()
        assert catalog.erasures.open()  # not finished
        if moment == "while waiting for a replica":
            catalog.replicas.leave()  # the replica serving the old generation goes away
        done = run_gateway("erase", "--tenant", "acme", "--wait", env=env)
        assert done.returncode == 0, done.stderr
        assert catalog.erasures.open() == []
        found = scan(layout.root, ids, vectors)
        assert found.empty, found
        _still_answers(client, alice)


def test_tenant_delete_asks_then_removes_everything_of_the_tenant(
    tmp_path: Path, embedder: Embedder, jwks_file: Path, make_token: TokenFactory
) -> None:
    layout, env, ingest = _setup(tmp_path, embedder, jwks_file, erase_within_s=3600)
    catalog = layout.open_catalog()
    other, _ = create_key(catalog, tenant="globex", region="EU", principals=[], scope="ingest")
    for tenant in ("acme", "globex"):  # each with a directory user, as SCIM provisions one
        catalog.directory.create_user(tenant, UserFields(user_name="dana"))
    with (
        running_server(env, worker=True) as (base, _),
        httpx.Client(base_url=base, timeout=120) as client,
    ):
        ids = _push(client, ingest, range(2))
        kept = client.post(
            "/admin/documents?wait=true",
            json={
                "documents": [
                    {**canary_doc(9), "doc_id": "globex-note", "title": "Otters", "text": "Otters."}
                ]
            },
            headers=bearer(other),
        )
        assert kept.status_code == 200, kept.text
        vectors = canary_vectors(str(layout.vectors), None, ids)

        asked = subprocess.run(
            [gateway_command(), "tenant", "delete", "--tenant", "acme"],
            env=env, input="n\n", capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert asked.returncode != 0 and "Delete tenant 'acme'" in asked.stdout
        assert catalog.tenant_counts("acme")[1] > 0  # nothing removed

        done = run_gateway("tenant", "delete", "--tenant", "acme", "--yes", env=env)
        assert done.returncode == 0, done.stderr
        assert "erased through generation" in done.stdout
        assert catalog.tenant_counts("acme") == (0, 0, 0)
        assert [k.tenant for k in catalog.api_keys()] == ["globex"]
        assert catalog.directory.entry("acme", "userName", "dana") is None
        assert catalog.directory.entry("globex", "userName", "dana") is not None
        assert catalog.jobs.recent("acme", 10) == []
        assert client.get("/admin/jobs/x", headers=ingest).status_code == 401  # key gone
        found = scan(layout.root, ids, vectors)
        assert found.empty, found
        globex = client.post(
            "/search",
            json={"query": "otters"},
            headers=bearer(make_token(sub="g1", tenant="globex", region="EU", groups=["staff"])),
        )
        assert globex.json()["results"][0]["doc_id"] == "globex-note"  # another tenant's
