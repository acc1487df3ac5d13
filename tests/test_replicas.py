"""Two serving replicas and a writer, as separate processes, sharing a PostgreSQL catalog
(a throwaway cluster on loopback) and the index: one data dir for all of them, or an
S3-compatible store (SeaweedFS on loopback) with a data dir each. A push to replica A is found
on replica B by its next request, a revocation on A is refused by B's next request, B
keeps answering while A is killed, a directory membership removed or a user deactivated
through A's /scim/v2 is enforced by B's next request, a database that stops is 503 on B
and recovers by itself, and a second writer waits for the lease and takes over when the
first dies."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from gateway.authn.apikeys import create_key
from gateway.bench.server import gateway_command
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ALICE
from tests.helpers.documents import doc, write_corpus
from tests.helpers.identity import AUDIENCE, ISSUER, TokenFactory, bearer
from tests.helpers.postgres import throwaway_cluster
from tests.helpers.processes import gateway_env, running_server
from tests.helpers.seaweed import S3Store

pytestmark = [pytest.mark.server, pytest.mark.long]
USER = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP = "urn:ietf:params:scim:schemas:core:2.0:Group"
PATCH = "urn:ietf:params:scim:api:messages:2.0:PatchOp"


def writer(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [gateway_command(), "worker"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


@pytest.mark.parametrize("index", ["one data dir", "object store"])
def test_replicas_share_changes_and_survive_each_other_and_the_database(
    tmp_path: Path,
    embedder: Embedder,
    jwks_file: Path,
    make_token: TokenFactory,
    s3: S3Store,
    index: str,
) -> None:
    with throwaway_cluster() as cluster:
        url = cluster.new_database()
        common = gateway_env(
            GATEWAY_DATABASE_URL=url,
            GATEWAY_OIDC_ISSUER=ISSUER,
            GATEWAY_OIDC_AUDIENCE=AUDIENCE,
            GATEWAY_JWKS_URI=jwks_file.as_uri(),
        )
        if index == "object store":
            common.update(GATEWAY_INDEX_URI=s3.new_prefix(), **s3.env())

        def env(name: str) -> dict[str, str]:  # a data dir each, or the one
            own = name if index == "object store" else "data"
            return {**common, "GATEWAY_DATA_DIR": str(tmp_path / own)}

        store = None
        if index == "object store":
            store = s3.object_store(common["GATEWAY_INDEX_URI"])
        layout = DataLayout(Path(env("ingest")["GATEWAY_DATA_DIR"]), url, store)
        ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
        key, _ = create_key(
            layout.open_catalog(), tenant="acme", region="EU", principals=[], scope="ingest"
        )
        alice, ingest = bearer(make_token(**ALICE, ttl=900)), bearer(key)
        first_writer = writer(env("writer-1"))
        try:
            with running_server(env("a")) as (a, process_a), running_server(env("b")) as (b, _):

                def found_on_b(query: str) -> set[str]:
                    response = httpx.post(f"{b}/search", json={"query": query}, headers=alice)
                    assert response.status_code == 200, response.text
                    return {r["doc_id"] for r in response.json()["results"]}

                pushed = httpx.post(
                    f"{a}/admin/documents?wait=true",
                    json={"documents": [doc("pelican-r")]},
                    headers=ingest,
                    timeout=120,
                )
                assert pushed.status_code == 200 and pushed.json()["status"] == "succeeded"
                assert "pelican-r" in found_on_b("pelican quota")  # B's very next request

                for acl in (["group:board"], ["group:staff"], ["group:board"]):
                    changed = httpx.put(
                        f"{a}/admin/documents/pelican-r/acl", json={"acl": acl}, headers=ingest
                    )
                    assert changed.status_code == 200
                    visible = "pelican-r" in found_on_b("pelican quota")
                    assert visible == (acl == ["group:staff"])  # enforced on B at once

                # The directory: a membership removed through A is refused by B's next request.
                scim_key, _ = create_key(
                    layout.open_catalog(), tenant="acme", region="", principals=[], scope="scim"
                )
                with httpx.Client(base_url=f"{a}/scim/v2", headers=bearer(scim_key)) as scim:
                    user = scim.post("/Users", json={"schemas": [USER], "userName": "alice"})
                    assert user.status_code == 201, user.text
                    member = {"value": user.json()["id"]}
                    board = {"schemas": [GROUP], "displayName": "board", "members": [member]}
                    group = scim.post("/Groups", json=board)
                    assert group.status_code == 201, group.text
                    deadline = time.monotonic() + 5  # an addition is not waited for
                    while "pelican-r" not in found_on_b("pelican quota"):
                        assert time.monotonic() < deadline, "B never saw the membership"
                        time.sleep(0.05)
                    removed = scim.patch(
                        f"/Groups/{group.json()['id']}",
                        json={
                            "schemas": [PATCH],
                            "Operations": [{"op": "remove", "path": "members", "value": [member]}],
                        },
                    )
                    assert removed.status_code == 200, removed.text
                    assert "pelican-r" not in found_on_b("pelican quota")  # B's next request
                    off = {
                        "schemas": [PATCH],
                        "Operations": [{"op": "replace", "path": "active", "value": False}],
                    }
                    assert scim.patch(f"/Users/{member['value']}", json=off).status_code == 200
                    refused = httpx.post(f"{b}/search", json={"query": "x"}, headers=alice)
                    assert refused.status_code == 403
                    assert refused.json()["code"] == "account_disabled"
                    assert scim.delete(f"/Users/{member['value']}").status_code == 204
                    again = scim.post("/Users", json={"schemas": [USER], "userName": "alice"})
                    assert again.status_code == 201  # provisioned again: active
                    # A token issued before the name was given again is its former
                    # holder's (tests/test_identity_directory.py): alice signs in again.
                    alice = bearer(make_token(**ALICE, ttl=900))
                    deadline = time.monotonic() + 5
                    while (
                        httpx.post(f"{b}/search", json={"query": "x"}, headers=alice).status_code
                        != 200
                    ):
                        assert time.monotonic() < deadline, "B still refuses alice"
                        time.sleep(0.05)

                statuses: list[int] = []
                stop = threading.Event()

                def load() -> None:
                    with httpx.Client(base_url=b, headers=alice, timeout=30) as client:
                        while not stop.is_set():
                            statuses.append(
                                client.post("/search", json={"query": "refunds"}).status_code
                            )

                def wait_for_searches(count: int) -> None:
                    deadline = time.monotonic() + 30
                    while len(statuses) < count:
                        assert time.monotonic() < deadline and hammer.is_alive(), "B stalled"
                        time.sleep(0.01)

                hammer = threading.Thread(target=load)
                hammer.start()
                wait_for_searches(20)  # B answers while A runs
                process_a.send_signal(signal.SIGKILL)
                process_a.wait()
                wait_for_searches(len(statuses) + 40)  # and keeps answering after A is gone
                stop.set()
                hammer.join()
                assert set(statuses) == {200}  # B never noticed

                cluster.stop()
                assert httpx.get(f"{b}/readyz").status_code == 503  # it asks the catalog
                deadline = time.monotonic() + 5  # searches learn it from B's poll (0.2 s)
                while (
                    down := httpx.post(f"{b}/search", json={"query": "refunds"}, headers=alice)
                ).status_code == 200:
                    assert time.monotonic() < deadline, "B did not notice"
                    time.sleep(0.05)
                assert down.status_code == 503 and down.json()["code"] == "catalog_unavailable"
                cluster.start()
                deadline = time.monotonic() + 15
                while httpx.get(f"{b}/readyz").status_code != 200:
                    assert time.monotonic() < deadline, "B did not recover"
                    time.sleep(0.2)
                assert "refund-policy" in found_on_b("refunds paid RPL-14")

                second_writer = writer(env("writer-2"))  # waits: the first holds the lease
                try:
                    first_writer.send_signal(signal.SIGKILL)
                    first_writer.wait()
                    queued = httpx.post(
                        f"{b}/admin/documents?wait=true",
                        json={"documents": [doc("pelican-s")]},
                        headers=ingest,
                        timeout=120,
                    )
                    assert queued.status_code == 200, queued.text
                    assert queued.json()["status"] == "succeeded"  # by the second writer
                    assert "pelican-s" in found_on_b("pelican quota")
                finally:
                    second_writer.terminate()
                    second_writer.wait(timeout=60)
        finally:
            if first_writer.poll() is None:
                first_writer.terminate()
                first_writer.wait(timeout=60)
