"""Identifiers bounded in UTF-8 bytes where they enter, so that every value the gateway
accepts fits PostgreSQL's B-tree entry of at most 2,704 bytes: a doc_id and a version of at
most 1,024 bytes each at the push API (besides 512 characters, which hold 2,048) and at
`gateway ingest`, a tenant of at most 256 bytes at key creation, at ingest and in a token,
a token's subject of at most 1,024. A 512-character doc_id and version of 4-byte
characters used to be queued (202) and fail the job on PostgreSQL, naming only
`OperationalError`; a key of a 1,000-byte tenant made its SCIM writes of long names a 500;
a token of a 4,000-byte tenant or subject was served, and its audit record, which no index
could hold, stopped the audit trail for every tenant."""

from __future__ import annotations

import json
import random
import string
from pathlib import Path
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner, Result

from gateway.api.app import create_app
from gateway.authn.apikeys import create_key
from gateway.cli import app as cli
from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.ingest.worker import IngestWorker
from gateway.policy.loader import load_policy
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ROOT
from tests.helpers.documents import STAFF_EU, doc, write_doc
from tests.helpers.identity import TokenFactory, bearer
from tests.helpers.postgres import Cluster
from tests.helpers.push_app import deployment
from tests.helpers.scim import Scim

ID_BYTES, TENANT_BYTES, SUBJECT_BYTES = 1024, 256, 1024
EURO = "\u20ac"  # three bytes in UTF-8
ASCII = string.ascii_letters + string.digits
TWO_BYTE = "".join(map(chr, range(0x100, 0x250)))  # Latin Extended-A and -B letters


def noise(length: int, seed: int, alphabet: str = ASCII) -> str:
    """Random letters PostgreSQL cannot compress below their length in an index entry:
    the widest entries the bounds must leave room for."""
    rng = random.Random(seed)
    return "".join(rng.choice(alphabet) for _ in range(length))


def four_byte(length: int) -> str:
    """Distinct CJK Extension B ideographs, four bytes each in UTF-8."""
    return "".join(chr(0x20000 + i * 37) for i in range(length))


def test_ids_at_the_byte_bounds_are_stored_and_searchable_on_postgres_and_longer_ones_refused(
    postgres: Cluster, tmp_path: Path, jwks_file: Path, embedder: Embedder
) -> None:
    layout, settings, policy_dir = deployment(
        tmp_path, embedder, jwks_file, postgres.new_database()
    )
    # Every identifier at its bound at once: the catalog's widest index entries hold all three.
    tenant = noise(TENANT_BYTES, 1)
    catalog = layout.open_catalog()
    pusher, _ = create_key(catalog, tenant=tenant, region="EU", principals=[], scope="ingest")
    reader, _ = create_key(catalog, tenant=tenant, region="EU", principals=["group:staff"])
    writer = IngestWorker(layout, embedder, lambda: load_policy(policy_dir).policy)
    with TestClient(create_app(settings, embedder=embedder)) as client:
        # 257 characters, under the 512-character bound, and 1,028 bytes.
        over = four_byte(257)
        refused = client.post(
            "/admin/documents",
            json={"documents": [doc(over), doc("fine", version=over)]},
            headers=bearer(pusher),
        )
        assert refused.status_code == 422, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        problems = {(e["index"], e["field"]): e["message"] for e in refused.json()["errors"]}
        assert problems == {
            (0, "doc_id"): "is 1028 bytes in UTF-8; the limit is 1024 bytes",
            (1, "version"): "is 1028 bytes in UTF-8; the limit is 1024 bytes",
        }
        assert writer.run_once() == 0  # nothing was queued

        # 512 characters of two bytes: at both bounds.
        doc_id, version = noise(ID_BYTES // 2, 2, TWO_BYTE), noise(ID_BYTES // 2, 3, TWO_BYTE)
        body = doc(doc_id, version=version, text="The pelican quota is PQ-77 units per quarter.")
        queued = client.post("/admin/documents", json={"documents": [body]}, headers=bearer(pusher))
        assert queued.status_code == 202, queued.text
        assert writer.run_once() == 1
        job = client.get(f"/admin/jobs/{queued.json()['job_id']}", headers=bearer(pusher)).json()
        assert job["status"] == "succeeded", job["errors"]
    # A new app serves the job's generation from its start (this one would within its poll).
    with TestClient(create_app(settings, embedder=embedder)) as client:
        found = client.post(
            "/search", json={"query": "pelican quota PQ-77"}, headers=bearer(reader)
        )
        assert found.status_code == 200, found.text
        assert [(r["doc_id"], r["version"]) for r in found.json()["results"]] == [(doc_id, version)]
        shown = client.get(f"/documents/{quote(doc_id)}", headers=bearer(reader))
        assert shown.status_code == 200 and shown.json()["version"] == version
    # The audit trail indexed the tenant and the doc_id as well (written at shutdown at the
    # latest): the push, the search and the read.
    audited = layout.open_catalog().audit.find(tenant, doc_id=doc_id)
    assert sorted(r.route for r in audited) == [
        "/admin/documents",
        "/documents/{doc_id}",
        "/search",
    ]


@pytest.mark.parametrize(
    ("tenant", "size"),
    [(noise(TENANT_BYTES + 1, 4), 257), (EURO * 86, 258)],
    ids=["ascii", "three-byte"],
)
def test_keys_create_refuses_a_tenant_over_256_bytes(
    tmp_path: Path, tenant: str, size: int
) -> None:
    def keys_create(tenant: str) -> Result:
        args = ["--data-dir", str(tmp_path), "--tenant", tenant, "--region", "EU"]
        return CliRunner().invoke(cli, ["keys", "create", *args, "--principal", "group:staff"])

    refused = keys_create(tenant)
    assert refused.exit_code == 1
    assert f"key not created: tenant is {size} bytes in UTF-8; the limit is 256" in refused.output
    assert DataLayout(tmp_path).open_catalog().api_keys() == []
    at_bound = EURO * 85 + "a"  # 256 bytes
    made = keys_create(at_bound)
    assert made.exit_code == 0, made.output
    assert [k.tenant for k in DataLayout(tmp_path).open_catalog().api_keys()] == [at_bound]


def test_a_scim_key_of_a_tenant_at_the_bound_stores_the_longest_names_on_postgres(
    postgres: Cluster, tmp_path: Path, jwks_file: Path, embedder: Embedder
) -> None:
    """The directory indexes the tenant beside userName, externalId and displayName, each
    up to SCIM's 2,000 bytes: with a 256-byte tenant, every one of them fits."""
    layout, settings, _ = deployment(tmp_path, embedder, jwks_file, postgres.new_database())
    key, _ = create_key(
        layout.open_catalog(), tenant=noise(TENANT_BYTES, 5), region="", principals=[], scope="scim"
    )
    with TestClient(create_app(settings, embedder=embedder)) as client:
        scim = Scim(client, key)
        ann = scim.user(noise(2000, 6), externalId=noise(2000, 7))
        crew = scim.group(noise(2000, 8), ann)
        assert scim("GET", f"/Groups/{crew}").json()["members"][0]["value"] == ann


def jsonl_record(**fields: str) -> dict[str, object]:
    base = {"doc_id": "handbook", "version": "1", "tenant": "acme", "region": "EU"}
    return {**base, "acl": ["group:staff"], "effective_from": "2020-01-01", **fields}


@pytest.mark.model  # the CLI loads the model itself
def test_gateway_ingest_refuses_ids_over_their_bounds_and_stores_them_at_the_bounds_on_postgres(
    postgres: Cluster, tmp_path: Path
) -> None:
    """`gateway ingest` had no byte bound: on PostgreSQL a JSONL record of a 1,400-byte
    doc_id and version failed the whole run naming only `OperationalError`."""
    url = postgres.new_database()
    data = tmp_path / "data"

    def ingest(records: list[dict[str, object]], name: str) -> Result:
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        args = ["ingest", str(path), "--data-dir", str(data)]
        return CliRunner().invoke(cli, args, env={"GATEWAY_DATABASE_URL": url})

    over = four_byte(257)  # 257 characters, 1,028 bytes
    text = "The pelican quota is PQ-77 units per quarter."
    refused = ingest(
        [
            jsonl_record(doc_id=over, text=text),
            jsonl_record(doc_id="other", version=over, text=text),
            jsonl_record(doc_id="third", tenant=EURO * 86, text=text),  # 258 bytes
        ],
        "over.jsonl",
    )
    assert refused.exit_code == 1
    source = tmp_path / "over.jsonl"
    for line, field, size, limit in (
        (1, "doc_id", 1028, 1024),
        (2, "version", 1028, 1024),
        (3, "tenant", 258, 256),
    ):
        problem = f"{source}:{line}: {field}: is {size} bytes in UTF-8; the limit is {limit} bytes"
        assert problem in refused.output, refused.output
    assert over not in refused.output  # sizes, never the identifier
    assert DataLayout(data, url).open_catalog().all_documents() == []

    # Every identifier at its bound at once, in the letters that make the widest entries.
    tenant = noise(TENANT_BYTES, 11)
    doc_id, version = noise(ID_BYTES // 2, 12, TWO_BYTE), noise(ID_BYTES // 2, 13, TWO_BYTE)
    stored = ingest(
        [jsonl_record(doc_id=doc_id, version=version, tenant=tenant, text=text)], "at.jsonl"
    )
    assert stored.exit_code == 0, stored.output
    assert DataLayout(data, url).open_catalog().document(tenant, doc_id, version) is not None


def test_a_tenant_or_subject_claim_over_its_bound_is_refused_and_the_audit_trail_serves_on(
    postgres: Cluster, tmp_path: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    """A token whose tenant claim was 1,000 four-byte characters got 200 on /search; its
    audit record could not be stored (ix_audit_tenant), the batch it was in was retried for
    ever, and every later request of every tenant got 503 audit_unavailable."""
    layout, settings, _ = deployment(tmp_path, embedder, jwks_file, postgres.new_database())
    huge = four_byte(1000)  # 4,000 bytes: more than PostgreSQL indexes
    search = {"query": "refund policy"}
    with TestClient(create_app(settings, embedder=embedder)) as client:
        for claims, unusable in (
            ({"tenant": huge}, "tenant (4000 bytes in UTF-8; the limit is 256)"),
            ({"tenant": EURO * 86}, "tenant (258 bytes in UTF-8; the limit is 256)"),
            ({"sub": huge}, "sub (4000 bytes in UTF-8; the limit is 1024)"),
            (
                {"sub": huge, "tenant": huge},
                "sub (4000 bytes in UTF-8; the limit is 1024), "
                "tenant (4000 bytes in UTF-8; the limit is 256)",
            ),
        ):
            refused = client.post("/search", json=search, headers=bearer(make_token(**claims)))
            assert refused.status_code == 403, refused.text
            assert refused.headers["content-type"] == "application/problem+json"
            assert refused.json()["code"] == "insufficient_claims"
            assert refused.json()["detail"] == f"missing or unusable claims: {unusable}"
        state = client.app.state.gateway  # type: ignore[attr-defined]
        assert state.audit.flush()  # the records of the refusals (if any) were stored

        # Another tenant is served and audited; so is a token at both bounds.
        tenant, subject = noise(TENANT_BYTES, 14), noise(SUBJECT_BYTES, 15)
        for token in (make_token(sub="alice"), make_token(sub=subject, tenant=tenant)):
            served = client.post("/search", json=search, headers=bearer(token))
            assert served.status_code == 200, served.text
        assert client.get("/readyz").status_code == 200
        assert state.audit.flush()
    catalog = layout.open_catalog()
    assert [r.route for r in catalog.audit.find("acme", subject="alice")] == ["/search"]
    assert [r.route for r in catalog.audit.find(tenant, subject=subject)] == ["/search"]


def test_a_delete_or_acl_change_naming_an_impossible_doc_id_leaves_the_audit_trail_serving(
    postgres: Cluster, tmp_path: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    """A DELETE or ACL PUT whose path named a 3,000-byte doc_id got its 404, but its audit
    record named that doc_id among the indexed IDs, which PostgreSQL cannot index: the
    batch failed again and again, and every tenant's searches got 503 audit_unavailable."""
    layout, settings, _ = deployment(tmp_path, embedder, jwks_file, postgres.new_database())
    key, _ = create_key(
        layout.open_catalog(), tenant="acme", region="EU", principals=[], scope="ingest"
    )
    impossible = quote(noise(3000, 16), safe="")
    admin = bearer(key)
    with TestClient(create_app(settings, embedder=embedder)) as client:
        state = client.app.state.gateway  # type: ignore[attr-defined]
        deleted = client.delete(f"/admin/documents/{impossible}", headers=admin)
        acl = client.put(
            f"/admin/documents/{impossible}/acl", json={"acl": ["group:staff"]}, headers=admin
        )
        assert (deleted.status_code, acl.status_code) == (404, 404), (deleted.text, acl.text)
        assert state.audit.flush()  # both records were stored
        served = client.post(
            "/search", json={"query": "refund policy"}, headers=bearer(make_token(sub="alice"))
        )
        assert served.status_code == 200, served.text
        assert state.audit.flush()
    catalog = layout.open_catalog()
    assert [r.route for r in catalog.audit.find("acme", subject="alice")] == ["/search"]


def test_every_version_and_doc_id_ingest_stores_can_be_named_and_longer_ones_name_nothing(
    tmp_path: Path, jwks_file: Path, embedder: Embedder, make_token: TokenFactory
) -> None:
    """`gateway ingest` stores a version or doc_id of up to 1,024 bytes, but the ACL route's
    `version` and DELETE's `?version=` took at most 512 characters (422), and explain's
    doc_id 1,000: such a version could not be narrowed or deleted alone over HTTP, nor
    such a document explained. Now each takes up to 1,024 bytes in UTF-8; a longer one
    names nothing (404), as a doc_id in a path does."""
    layout, settings, _ = deployment(tmp_path, embedder, jwks_file)
    version, doc_id = "v" * ID_BYTES, "d" * ID_BYTES  # at the bound, both over 1,000 characters
    meta = {**STAFF_EU, "effective_from": "2020-01-01"}
    docs = tmp_path / "long"
    for name, fields in (
        ("narrowed.md", {"doc_id": "narrowed", "version": version}),
        ("gone.md", {"doc_id": "gone", "version": version}),
        ("explained.md", {"doc_id": doc_id, "version": "1"}),
    ):
        write_doc(docs, name, {**fields, **meta}, "The pelican quota is PQ-77 units per quarter.")
    ingest_paths([docs], layout, embedder)
    admin, alice = bearer(make_token(**ROOT)), bearer(make_token(sub="alice", groups=["staff"]))
    claims = {"sub": "alice", "tenant": "acme", "region": "EU", "groups": ["staff"]}
    with TestClient(create_app(settings, embedder=embedder)) as client:
        # One byte over: names nothing, and nothing is changed.
        over = version + "v"
        acl = client.put(
            "/admin/documents/narrowed/acl",
            json={"acl": ["group:board"], "version": over},
            headers=admin,
        )
        deleted = client.delete("/admin/documents/gone", params={"version": over}, headers=admin)
        explained = client.post(
            "/admin/explain", json={"subject": claims, "doc_id": doc_id + "d"}, headers=admin
        )
        for refused in (acl, deleted, explained):
            assert refused.status_code == 404, refused.text
            assert refused.json()["code"] == "not_found"
        assert client.get("/documents/narrowed", headers=alice).json()["version"] == version
        assert client.get("/documents/gone", headers=alice).json()["version"] == version

        # At the bound: named, changed, deleted, explained.
        acl = client.put(
            "/admin/documents/narrowed/acl",
            json={"acl": ["group:board"], "version": version},
            headers=admin,
        )
        assert acl.status_code == 200 and acl.json()["versions"] == 1, acl.text
        deleted = client.delete("/admin/documents/gone", params={"version": version}, headers=admin)
        assert deleted.status_code == 200 and deleted.json()["versions"] == 1, deleted.text
        assert client.get("/documents/narrowed", headers=alice).status_code == 404
        assert client.get("/documents/gone", headers=alice).status_code == 404
        explained = client.post(
            "/admin/explain", json={"subject": claims, "doc_id": doc_id}, headers=admin
        )
        assert explained.status_code == 200, explained.text
        assert (explained.json()["visible"], explained.json()["version"]) == (True, "1")
