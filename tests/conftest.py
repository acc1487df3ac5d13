"""Shared fixtures: the real model, a real corpus ingested into real engines, a real issuer."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from gateway.api.app import create_app  # noqa: E402
from gateway.authn.devkeys import SigningKey, generate_signing_key, write_jwks  # noqa: E402
from gateway.embedding import Embedder  # noqa: E402
from gateway.ingest.pipeline import ingest_paths  # noqa: E402
from gateway.settings import Settings  # noqa: E402
from gateway.storage.layout import DataLayout  # noqa: E402
from tests.postgres import Cluster, throwaway_cluster  # noqa: E402
from tests.seaweed import S3Store, throwaway_store  # noqa: E402

OWN_ENVIRONMENT = ("GATEWAY_", "OTEL_")
ISSUER = "https://issuer.test"
AUDIENCE = "rag-gateway"
TODAY = dt.datetime.now(dt.UTC).date()


def day(offset: int) -> str:
    return (TODAY + dt.timedelta(days=offset)).isoformat()


def write_doc(root: Path, name: str, meta: dict[str, Any], body: str) -> Path:
    lines = ["---"]
    for key, value in meta.items():
        lines.append(f"{key}: {json.dumps(value)}")
    lines += ["---", body, ""]
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


STAFF_EU = {"tenant": "acme", "region": "EU", "acl": ["group:staff"]}

# (file, front matter, body). Codes are unique strings a leak would reveal.
CORPUS: list[tuple[str, dict[str, Any], str]] = [
    (
        "refund-v1.md",
        {
            "doc_id": "refund-policy",
            "version": "1",
            "title": "Refund policy",
            **STAFF_EU,
            "effective_from": "2020-01-01",
        },
        "# Refund policy\n\nRefunds are paid within 30 days under rule OLDV-1001. "
        "Customers must keep the receipt.",
    ),
    (
        "refund-v2.md",
        {
            "doc_id": "refund-policy",
            "version": "2",
            "title": "Refund policy",
            **STAFF_EU,
            "effective_from": day(-30),
        },
        "# Refund policy\n\nRefunds are paid within 5 days under rule RPL-14. "
        "Customers must keep the receipt or an order number.",
    ),
    (
        "future-v1.md",
        {
            "doc_id": "loyalty",
            "version": "1",
            "title": "Loyalty programme",
            **STAFF_EU,
            "effective_from": day(-100),
        },
        "Loyalty points are earned at one point per euro under rule LOY-0001.",
    ),
    (
        "future-v2.md",
        {
            "doc_id": "loyalty",
            "version": "2",
            "title": "Loyalty programme",
            **STAFF_EU,
            "effective_from": day(10),
        },
        "Loyalty points are earned at two points per euro under rule LOY-0002.",
    ),
    (
        "merchant.md",
        {
            "doc_id": "merchant-fraud",
            "title": "Merchant fraud thresholds",
            "tenant": "acme",
            "region": "EU",
            "acl": ["group:merchant-risk"],
            "effective_from": "2021-01-01",
        },
        "Merchants above the chargeback threshold MRX-7781 are suspended pending review.",
    ),
    (
        "starts-today.md",
        {"doc_id": "starts-today", "title": "Starts today", **STAFF_EU, "effective_from": day(0)},
        "The new shift roster BND-0101 applies from its first day.",
    ),
    (
        "ends-today.md",
        {
            "doc_id": "ends-today",
            "title": "Ends today",
            **STAFF_EU,
            "effective_from": "2022-01-01",
            "effective_to": day(0),
        },
        "The winter dress code BND-0202 applies until its last day.",
    ),
    (
        "ended.md",
        {
            "doc_id": "ended-yesterday",
            "title": "Ended",
            **STAFF_EU,
            "effective_from": "2022-01-01",
            "effective_to": day(-1),
        },
        "The old parking rule BND-0303 no longer applies.",
    ),
    (
        "us.md",
        {
            "doc_id": "us-holidays",
            "title": "US holidays",
            "tenant": "acme",
            "region": "US",
            "acl": ["group:staff"],
            "effective_from": "2020-01-01",
        },
        "Thanksgiving closing hours follow rule USR-5150 in every US store.",
    ),
    (
        "globex.md",
        {
            "doc_id": "globex-pricing",
            "title": "Globex pricing",
            "tenant": "globex",
            "region": "EU",
            "acl": ["group:staff"],
            "effective_from": "2020-01-01",
        },
        "Globex price matching follows rule GLX-9000 for all competitors.",
    ),
    (
        "remote.md",
        {
            "doc_id": "remote-work",
            "title": "Flexible arrangements",
            **STAFF_EU,
            "effective_from": "2020-01-01",
        },
        "Employees may perform their duties from their residence up to three days per week, "
        "provided their line manager approves the arrangement in writing.",
    ),
    (
        "quoted.md",
        {
            "doc_id": "quoted-team",
            "title": "Quoted team note",
            "tenant": "acme",
            "region": "EU",
            "acl": ['group:o\'brien "team"'],
            "effective_from": "2020-01-01",
        },
        "The quoted team keeps its inventory ledger under rule QTE-4242.",
    ),
    (
        "dup-a.md",
        {"doc_id": "dup-a", "title": "Shared text", **STAFF_EU, "effective_from": "2020-01-01"},
        "Gift cards never expire and can be used in any store, rule GFT-0001.",
    ),
    (
        "dup-b.md",
        {
            "doc_id": "dup-b",
            "title": "Shared text",
            "tenant": "acme",
            "region": "EU",
            "acl": ["group:merchant-risk"],
            "effective_from": "2020-01-01",
        },
        "Gift cards never expire and can be used in any store, rule GFT-0001.",
    ),
]
FILLER = [
    "Store opening hours are nine to six on weekdays and ten to four on Saturdays.",
    "Price tags must show the unit price for groceries sold by weight.",
    "Damaged goods are returned to the central warehouse every Friday.",
    "Cash registers are counted by two employees at the end of every shift.",
    "Customer complaints are logged in the service desk tool within one hour.",
    "Seasonal staff receive safety training before their first shift.",
    "Shelf labels are printed overnight from the pricing system.",
    "Fire exits must stay clear of pallets and boxes at all times.",
]
for i, text in enumerate(FILLER):
    CORPUS.append(
        (
            f"filler/f{i}.md",
            {
                "doc_id": f"filler-{i}",
                "title": f"Store note {i}",
                **STAFF_EU,
                "effective_from": "2020-01-01",
            },
            text,
        )
    )


def write_corpus(root: Path) -> Path:
    for name, meta, body in CORPUS:
        write_doc(root, name, meta, body)
    return root


@pytest.fixture(scope="session", autouse=True)
def _no_developer_environment() -> Iterator[None]:
    """Tests see the settings they make, not the GATEWAY_* or OTEL_* variables of the shell
    that runs them (a developer's data dir or issuer would change what they test)."""
    with pytest.MonkeyPatch.context() as patch:
        for name in list(os.environ):
            if name.startswith(OWN_ENVIRONMENT):
                patch.delenv(name)
        yield


# What `-m "not slow"` leaves out: tests that load the embedding model, start a server
# process, or need an LLM endpoint. `make check` runs the rest, in well under 90 s.
SLOW_MARKERS = ("model", "server", "llm")
MODEL_FIXTURES = {"embedder"}  # every model load in the tests goes through these
SERVER_FIXTURES = {"postgres", "s3"}  # fixtures that start server processes


@pytest.fixture(autouse=True)
def _model_loads_only_where_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    """Keeps the markers true: a test that loads the model (sentence-transformers, torch)
    without the `model` marker fails, so `-m "not slow"` stays fast."""
    loaded = "sentence_transformers" in sys.modules
    yield
    loaded_here = not loaded and "sentence_transformers" in sys.modules
    if loaded_here and request.node.get_closest_marker("model") is None:
        pytest.fail("this test loads the embedding model: mark it `model`")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.server)
        if any(item.get_closest_marker(name) for name in SLOW_MARKERS):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Cluster]:
    """A PostgreSQL cluster of the test session's own; each test makes its databases."""
    with throwaway_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Store]:
    """An S3-compatible store of the test session's own; each test takes a prefix."""
    with throwaway_store() as store:
        yield store


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    return Embedder()


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def data_dir(
    tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path, embedder: Embedder
) -> Path:
    root = tmp_path_factory.mktemp("data")
    ingest_paths([corpus_dir], DataLayout(root), embedder)
    return root


@pytest.fixture(scope="session")
def signing_key() -> SigningKey:
    return generate_signing_key("RS256", kid="test-key-1")


@pytest.fixture(scope="session")
def jwks_file(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> Path:
    path = tmp_path_factory.mktemp("issuer") / "jwks.json"
    write_jwks(path, signing_key.public_jwks())
    return path


TokenFactory = Callable[..., str]


@pytest.fixture(scope="session")
def make_token(signing_key: SigningKey) -> TokenFactory:
    def _make(
        sub: str = "alice",
        tenant: str | None = "acme",
        region: str | None = "EU",
        groups: list[str] | None = None,
        ttl: int = 300,
        **extra: Any,
    ) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": sub,
            "iat": now,
            "exp": now + ttl,
            "groups": groups if groups is not None else ["staff"],
        }
        if tenant is not None:
            claims["tenant"] = tenant
        if region is not None:
            claims["region"] = region
        claims.update(extra)
        return signing_key.sign(claims)

    return _make


def make_settings(data_dir: Path, jwks_file: Path, policy_dir: Path | None = None) -> Settings:
    return Settings(
        data_dir=data_dir,
        policy_dir=policy_dir,
        oidc_issuer=ISSUER,
        oidc_audience=AUDIENCE,
        jwks_uri=jwks_file.as_uri(),
    )


@pytest.fixture(scope="session")
def client(data_dir: Path, jwks_file: Path, embedder: Embedder) -> Iterator[TestClient]:
    app = create_app(make_settings(data_dir, jwks_file), embedder=embedder)
    with TestClient(app) as test_client:
        yield test_client


def copy_data_dir(source: Path, target: Path) -> Path:
    """A copy of a data dir that this process may have open. Not `shutil.copytree` alone:
    opening and closing the live catalog's files from this process drops the POSIX locks
    SQLite holds on them, and a server process on the same dir may then checkpoint and
    delete the WAL under the open connections (SQLite's "how to corrupt", 2.2). The
    catalog goes through SQLite's backup API instead."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("catalog.db*"))
    live = sqlite3.connect(source / "catalog.db")
    copy = sqlite3.connect(target / "catalog.db")
    try:
        live.backup(copy)
    finally:
        copy.close()
        live.close()
    return target


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
