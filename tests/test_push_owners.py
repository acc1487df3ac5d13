"""What an ingest key may change through the push API: only documents it pushed itself
(the catalog records who pushed each version), and, for a key made with `--doc-prefix`,
only doc_ids inside that prefix. Anything else is 403 with its own code and changes
nothing; a tenant admin may still change any of the tenant's documents."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from typer.testing import CliRunner

from gateway.api.app import create_app
from gateway.api.batches import validated_batch
from gateway.authn.apikeys import create_key
from gateway.cli import app as cli
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.ingest.records import record_of
from gateway.ingest.worker import IngestWorker
from gateway.policy.loader import load_policy
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ALICE, ROOT
from tests.helpers.documents import doc, write_corpus
from tests.helpers.identity import TokenFactory, bearer, make_settings
from tests.helpers.policies import write_policy


class Tenant:
    """acme, served in-process with its writer run by the test, and two ingest keys."""

    def __init__(self, client: TestClient, writer: IngestWorker, layout: DataLayout) -> None:
        self.client, self.writer, self.layout = client, writer, layout
        catalog = layout.open_catalog()
        self.a, self.a_row = create_key(
            catalog, tenant="acme", region="EU", principals=[], scope="ingest"
        )
        self.b, self.b_row = create_key(
            catalog, tenant="acme", region="EU", principals=[], scope="ingest"
        )

    def push(self, key: str, *documents: dict[str, Any]) -> Any:
        return self.client.post(
            "/admin/documents", json={"documents": list(documents)}, headers=bearer(key)
        )

    def delete(self, key: str, doc_id: str, **params: str) -> Any:
        return self.client.delete(f"/admin/documents/{doc_id}", params=params, headers=bearer(key))

    def set_acl(self, key: str, doc_id: str, acl: list[str]) -> Any:
        return self.client.put(
            f"/admin/documents/{doc_id}/acl", json={"acl": acl}, headers=bearer(key)
        )

    def found(self, token: str, query: str) -> set[str]:
        response = self.client.post("/search", json={"query": query}, headers=bearer(token))
        assert response.status_code == 200, response.text
        return {r["doc_id"] for r in response.json()["results"]}


@pytest.fixture
def acme(tmp_path: Path, embedder: Embedder, jwks_file: Path) -> Iterator[Tenant]:
    layout = DataLayout(tmp_path / "data")
    ingest_paths([write_corpus(tmp_path / "corpus")], layout, embedder)
    policy_dir = write_policy(tmp_path / "policy")
    settings = make_settings(layout.root, jwks_file, policy_dir)
    writer = IngestWorker(layout, embedder, lambda: load_policy(policy_dir).policy)
    with TestClient(create_app(settings, embedder=embedder)) as client:
        yield Tenant(client, writer, layout)


def refused(response: Any, code: str) -> None:
    assert response.status_code == 403, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == code


def test_a_key_cannot_replace_change_or_delete_what_another_key_pushed(
    acme: Tenant, make_token: TokenFactory
) -> None:
    assert acme.push(acme.a, doc("pelican-a")).status_code == 202
    acme.writer.run_once()
    row = acme.writer.catalog.document("acme", "pelican-a", "1")
    jobs = acme.writer.catalog.jobs.counts()

    refused(acme.delete(acme.b, "pelican-a", version="1"), "not_owner")
    refused(acme.delete(acme.b, "pelican-a"), "not_owner")
    refused(acme.set_acl(acme.b, "pelican-a", ["group:board"]), "not_owner")
    refused(acme.push(acme.b, doc("pelican-a", text="The pelican quota is 0.")), "not_owner")
    refused(acme.push(acme.b, doc("pelican-a", version="2")), "not_owner")  # would close it
    assert acme.writer.catalog.jobs.counts() == jobs  # nothing was queued
    alice = make_token(**ALICE)
    assert "pelican-a" in acme.found(alice, "pelican quota")
    assert acme.writer.catalog.document("acme", "pelican-a", "1") == row  # unchanged
    assert row is not None and row.pushed_by == f"key:{acme.a_row.key_id}"  # on record

    assert acme.set_acl(acme.a, "pelican-a", ["group:board"]).status_code == 200
    assert "pelican-a" not in acme.found(alice, "pelican quota")
    assert acme.delete(acme.a, "pelican-a", version="1").status_code == 200


def test_a_key_cannot_drop_another_keys_queued_batch(
    acme: Tenant, make_token: TokenFactory
) -> None:
    assert acme.push(acme.a, doc("pelican-q")).status_code == 202  # queued, not yet written
    refused(acme.delete(acme.b, "pelican-q"), "not_owner")
    refused(acme.set_acl(acme.b, "pelican-q", ["group:board"]), "not_owner")
    refused(acme.push(acme.b, doc("pelican-q", text="Overwritten.")), "not_owner")
    assert acme.writer.run_once() == 1
    assert "pelican-q" in acme.found(make_token(**ALICE), "pelican quota")


def test_documents_of_gateway_ingest_are_an_admins_until_handed_to_a_key(
    acme: Tenant, make_token: TokenFactory
) -> None:
    alice = make_token(**ALICE)
    refused(acme.delete(acme.a, "refund-policy"), "not_owner")
    refused(acme.set_acl(acme.a, "refund-policy", ["group:board"]), "not_owner")
    assert "refund-policy" in acme.found(alice, "refunds paid RPL-14")

    adopt = ["keys", "adopt", acme.a_row.key_id, "--data-dir", str(acme.layout.root)]
    adopted = CliRunner().invoke(cli, adopt)  # by default: only what the key pushed
    assert adopted.exit_code == 0, adopted.output
    assert f"key {acme.a_row.key_id} now holds 0 versions" in adopted.output
    refused(acme.delete(acme.a, "refund-policy"), "not_owner")
    adopted = CliRunner().invoke(cli, [*adopt, "--all"])
    assert adopted.exit_code == 0, adopted.output
    assert f"key {acme.a_row.key_id} now holds" in adopted.output
    refused(acme.delete(acme.b, "refund-policy"), "not_owner")  # handed to a, not b
    assert acme.delete(acme.a, "refund-policy").status_code == 200
    assert "refund-policy" not in acme.found(alice, "refunds paid RPL-14")

    assert acme.push(acme.a, doc("pelican-admin")).status_code == 202
    acme.writer.run_once()
    admin = bearer(make_token(**ROOT))  # an admin of the tenant changes any document
    assert acme.client.delete("/admin/documents/pelican-admin", headers=admin).status_code == 200


def test_a_key_with_a_doc_prefix_writes_only_inside_it(acme: Tenant) -> None:
    catalog = acme.layout.open_catalog()
    hr, _ = create_key(
        catalog, tenant="acme", region="EU", principals=[], scope="ingest", doc_prefix="hr-"
    )
    jobs = catalog.jobs.counts()
    outside = acme.push(hr, doc("hr-leave"), doc("fin-budget"))
    refused(outside, "outside_doc_prefix")
    assert "fin-budget" in outside.json()["detail"]
    assert catalog.jobs.counts() == jobs  # all or nothing: the batch was not queued
    refused(acme.delete(hr, "refund-policy"), "outside_doc_prefix")
    refused(acme.set_acl(hr, "refund-policy", ["group:board"]), "outside_doc_prefix")

    assert acme.push(hr, doc("hr-leave")).status_code == 202
    acme.writer.run_once()
    assert acme.delete(hr, "hr-leave").status_code == 200


def test_two_keys_pushing_one_new_document_at_once_the_later_job_fails_not_owner(
    acme: Tenant,
) -> None:
    """The push route checks ownership when it queues a job: two keys pushing the same new
    doc_id at the same moment both pass it. The writer checks again under its lock, in
    order of arrival: the later key's job fails with not_owner and writes nothing, the
    other jobs of the claim go on."""
    jobs = acme.writer.catalog.jobs
    a, b = f"key:{acme.a_row.key_id}", f"key:{acme.b_row.key_id}"

    def queued(subject: str, *documents: dict[str, Any]) -> str:  # as if both passed the route
        body = json.dumps({"documents": list(documents)}).encode()
        records = [record_of(d) for d in validated_batch(body, "acme")]
        return jobs.submit("acme", subject, records, 100).job_id

    first = queued(a, doc("pelican-race", title="Mine"))
    second = queued(b, doc("pelican-race", title="Taken over"))
    other = queued(b, doc("pelican-b2"))
    while acme.writer.run_once():
        pass
    row = acme.writer.catalog.document("acme", "pelican-race", "1")
    assert row is not None and row.pushed_by == a and row.title == "Mine"
    assert [jobs.job("acme", j).status for j in (first, second, other)] == [  # type: ignore[union-attr]
        "succeeded",
        "failed",
        "succeeded",
    ]
    [error] = jobs.job("acme", second).errors  # type: ignore[union-attr]
    assert error["message"].startswith("not_owner: documents ['pelican-race']")
    written = acme.writer.catalog.document("acme", "pelican-b2", "1")
    assert written is not None and written.pushed_by == b

    late = queued(b, doc("pelican-race", version="2"))  # a later claim: the stored version's
    while acme.writer.run_once():
        pass
    assert jobs.job("acme", late).status == "failed"  # type: ignore[union-attr]
    assert acme.writer.catalog.document("acme", "pelican-race", "2") is None


def test_keys_adopt_hands_a_key_only_its_own_earlier_pushes_unless_all(acme: Tenant) -> None:
    """Versions pushed before pushers were recorded have none; `gateway keys adopt` hands a
    key those that came from its own jobs, never `gateway ingest`'s nor another key's
    (a folder writer who can plant a connector's state must not get those deleted)."""
    catalog = acme.writer.catalog
    assert acme.push(acme.a, doc("pelican-old-a")).status_code == 202
    assert acme.push(acme.b, doc("pelican-old-b")).status_code == 202
    while acme.writer.run_once():
        pass
    with catalog.engine.begin() as connection:  # as pushed before 0006 recorded pushers
        connection.execute(text("UPDATE documents SET pushed_by = NULL"))

    def adopt(*extra: str) -> str:
        done = CliRunner().invoke(
            cli, ["keys", "adopt", acme.a_row.key_id, "--data-dir", str(acme.layout.root), *extra]
        )
        assert done.exit_code == 0, done.output
        return done.output

    assert f"key {acme.a_row.key_id} now holds 1 versions" in adopt()
    a = f"key:{acme.a_row.key_id}"
    assert catalog.document("acme", "pelican-old-a", "1").pushed_by == a  # type: ignore[union-attr]
    assert catalog.document("acme", "pelican-old-b", "1").pushed_by is None  # type: ignore[union-attr]
    assert catalog.document("acme", "refund-policy", "1").pushed_by is None  # type: ignore[union-attr]
    refused(acme.delete(acme.a, "refund-policy"), "not_owner")
    refused(acme.delete(acme.a, "pelican-old-b"), "not_owner")

    assert "now holds 0 versions" not in adopt("--all")  # the rest, by the operator's choice
    assert catalog.document("acme", "refund-policy", "1").pushed_by == a  # type: ignore[union-attr]
    assert acme.delete(acme.a, "pelican-old-a").status_code == 200
