"""Erasure at scale: a PostgreSQL catalog, the index on an S3-compatible store (SeaweedFS on
loopback), a writer and two replicas with a data dir each. After deletes and `gateway
erase --tenant T --wait`, the canary documents are in no Tantivy index of any data dir, no
row of any version of the LanceDB tables on the store, no object of the bucket and no byte
of any file; a replica that was down while it ran erases its copy when it comes back."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gateway.authn.apikeys import create_key
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ALICE
from tests.helpers.canary import canary_doc, canary_vectors, scan
from tests.helpers.documents import write_corpus
from tests.helpers.identity import AUDIENCE, ISSUER, TokenFactory, bearer
from tests.helpers.policies import write_policy
from tests.helpers.postgres import throwaway_cluster
from tests.helpers.processes import gateway_env, run_gateway, running_server
from tests.helpers.seaweed import S3Store

pytestmark = [pytest.mark.server, pytest.mark.long]


def test_erasure_reaches_the_bucket_the_writer_and_both_replicas(
    tmp_path: Path, embedder: Embedder, jwks_file: Path, make_token: TokenFactory, s3: S3Store
) -> None:
    with throwaway_cluster() as cluster:
        url = cluster.new_database()
        common = gateway_env(
            GATEWAY_DATABASE_URL=url,
            GATEWAY_INDEX_URI=s3.new_prefix(),
            GATEWAY_POLICY_DIR=str(write_policy(tmp_path / "policy")),
            GATEWAY_OIDC_ISSUER=ISSUER,
            GATEWAY_OIDC_AUDIENCE=AUDIENCE,
            GATEWAY_JWKS_URI=jwks_file.as_uri(),
            **s3.env(),
        )

        def env(name: str) -> dict[str, str]:
            return {**common, "GATEWAY_DATA_DIR": str(tmp_path / name)}

        store = s3.object_store(common["GATEWAY_INDEX_URI"])
        layout = DataLayout(tmp_path / "ingest", url, store)
        ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
        catalog = layout.open_catalog()
        key, _ = create_key(catalog, tenant="acme", region="EU", principals=[], scope="ingest")
        alice, ingest = bearer(make_token(**ALICE, ttl=900)), bearer(key)
        dirs = [tmp_path / n for n in ("ingest", "a", "b", "eraser")]
        with running_server(env("a"), worker=True) as (a, _):
            with running_server(env("b")) as (b, _):
                batch = {"documents": [canary_doc(n) for n in range(3)]}
                pushed = httpx.post(
                    f"{a}/admin/documents?wait=true", json=batch, headers=ingest, timeout=120
                )
                assert pushed.status_code == 200, pushed.text
                ids = [d["doc_id"] for d in batch["documents"]]
                vectors = canary_vectors(store.vectors_uri, store.lance_options, ids)
                for doc_id in ids:
                    gone = httpx.delete(f"{a}/admin/documents/{doc_id}", headers=ingest)
                    assert gone.status_code == 200
                found = httpx.post(f"{b}/search", json={"query": "vault"}, headers=alice)
                assert found.status_code == 200  # b has served the generations since
            # b is down now: the erasure does not wait for it, and b's copy still holds them
            before = scan(tmp_path / "b", ids, vectors, store=store)
            assert before.tantivy and before.lance and before.objects  # what a delete leaves
            done = run_gateway("erase", "--tenant", "acme", "--wait", env=env("eraser"))
            assert done.returncode == 0, done.stderr
            assert "erased through generation" in done.stdout
            for directory in [d for d in dirs if d.name != "b"]:
                found_in = scan(directory, ids, vectors, store=store)
                assert found_in.empty, (directory.name, found_in)
            answer = httpx.post(f"{a}/search", json={"query": "refunds paid"}, headers=alice)
            assert answer.status_code == 200 and answer.json()["results"]
            with running_server(env("b")) as (b, _):  # back: it erases its own copy
                answer = httpx.post(f"{b}/search", json={"query": "refunds paid"}, headers=alice)
                assert answer.status_code == 200 and answer.json()["results"]
                found_in = scan(tmp_path / "b", ids, vectors, store=store)
                assert found_in.empty, found_in
