"""Catalog schema migrations (Alembic): a new catalog is made at the newest revision, one
made by an earlier build of this release upgrades in place with `gateway db upgrade`, and
every command (serve included) refuses an out-of-date catalog, naming that command."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gateway.errors import GatewayError
from gateway.storage import schema
from gateway.storage.catalog import open_engine
from gateway.storage.layout import DataLayout
from tests.helpers.processes import gateway_env, run_gateway


def made_before_migrations(root: Path, with_scope: bool = False) -> DataLayout:
    """A data dir as the builds before migrations left it: the baseline tables, a document
    and a key, and no record of a revision (some builds had added the keys' scope)."""
    layout = DataLayout(root)
    root.mkdir(parents=True)
    schema.upgrade(open_engine(layout.catalog), "0001")
    with sqlite3.connect(layout.catalog) as db:
        db.execute("DROP TABLE alembic_version")
        db.execute(
            "INSERT INTO documents VALUES ('acme', 'policy', '1', 'Policy', '', 'EU', "
            "'[\"group:staff\"]', '2020-01-01', NULL, NULL, 'h', 's', 'Refunds.', 1)"
        )
        db.execute(
            "INSERT INTO api_keys VALUES ('k1', 'hash', 'bot', 'acme', 'EU', '[]', "
            "'2026-01-01 00:00:00', NULL, NULL)"
        )
        if with_scope:
            db.execute("ALTER TABLE api_keys ADD COLUMN scope VARCHAR NOT NULL DEFAULT 'ingest'")
    return layout


def test_a_new_catalog_is_made_at_the_newest_revision(tmp_path: Path) -> None:
    catalog = DataLayout(tmp_path / "data").open_catalog()
    with catalog.engine.connect() as connection:
        assert schema.revision_of(connection) == schema.head() == "0016"


def test_the_newest_revision_is_alembics_own_reading_of_the_migrations() -> None:
    """The catalog check reads the head from the file names, without Alembic: the
    migrations stay one line, numbered in order."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(schema.MIGRATIONS))
    assert script.get_heads() == [schema.head()]
    assert [r.revision for r in script.walk_revisions()] == sorted(
        (p.name[:4] for p in (schema.MIGRATIONS / "versions").glob("[0-9]*.py")), reverse=True
    )


@pytest.mark.server
@pytest.mark.parametrize("with_scope", [False, True])
def test_an_earlier_catalog_is_refused_then_upgraded_in_place(
    tmp_path: Path, with_scope: bool
) -> None:
    layout = made_before_migrations(tmp_path / "data", with_scope)
    with pytest.raises(GatewayError) as refused:
        layout.open_catalog()
    assert refused.value.code == "catalog_outdated"
    assert "gateway db upgrade" in refused.value.detail

    result = run_gateway("db", "upgrade", "--data-dir", str(layout.root), env=gateway_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"catalog schema upgraded: 0001 -> {schema.head()}"
    catalog = layout.open_catalog()
    document = catalog.document("acme", "policy", "1")
    assert document is not None and document.text == "Refunds."  # nothing lost
    assert document.pushed_by is None  # an ingest key changes it once it is handed over
    key = catalog.api_key("k1")
    assert key is not None and key.scope == ("ingest" if with_scope else "search")
    assert key.doc_prefix is None  # an existing key keeps writing any doc_id
    assert catalog.jobs.counts() == {}  # the jobs table is there
    again = run_gateway("db", "upgrade", "--data-dir", str(layout.root), env=gateway_env())
    assert again.stdout.strip() == f"catalog schema already at revision {schema.head()}"


@pytest.mark.server
def test_serve_refuses_an_out_of_date_catalog_naming_the_command(tmp_path: Path) -> None:
    layout = made_before_migrations(tmp_path / "data")
    env = gateway_env(
        GATEWAY_DATA_DIR=str(layout.root),
        GATEWAY_OIDC_ISSUER="https://issuer.test",
        GATEWAY_OIDC_AUDIENCE="gw",
        GATEWAY_JWKS_URI=(tmp_path / "jwks.json").as_uri(),
    )
    result = run_gateway("serve", "--port", "1", env=env)
    assert result.returncode == 1
    assert "catalog_outdated" in result.stderr and "gateway db upgrade" in result.stderr


@pytest.mark.server
def test_a_catalog_without_tenants_cannot_be_upgraded(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    with sqlite3.connect(root / "catalog.db") as db:
        db.execute("CREATE TABLE chunks (chunk_id VARCHAR PRIMARY KEY, doc_id VARCHAR)")
    result = run_gateway("db", "upgrade", "--data-dir", str(root), env=gateway_env())
    assert result.returncode == 1 and "ingest the documents again" in result.stderr


def test_a_catalog_at_0008_upgrades_to_the_erasure_requests(tmp_path: Path) -> None:
    """0011 adds the erasure requests beside what 0008 had; the result is the models'."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext
    from sqlmodel import SQLModel

    layout = DataLayout(tmp_path / "data")
    layout.root.mkdir(parents=True)
    engine = open_engine(layout.catalog)
    schema.upgrade(engine, "0008")
    assert schema.upgrade(engine) == ("0008", schema.head())
    catalog = layout.open_catalog()
    with catalog.engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), SQLModel.metadata) == []
    seq = catalog.erasures.request("acme", "operator")
    assert [r.seq for r in catalog.erasures.open()] == [seq]
