"""`gateway tenant delete` of a tenant the data dir does not hold says so and exits 1: it
printed "0 versions ... removed", requested an erasure and exited 0, so a mistyped tenant
looked deleted. A tenant with only keys, or only directory entries, is still deleted."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gateway.authn.apikeys import create_key
from gateway.cli import app as cli
from gateway.storage.directory_tables import UserFields
from gateway.storage.layout import DataLayout


def delete(layout: DataLayout, tenant: str) -> tuple[int, str]:
    args = ["tenant", "delete", "--tenant", tenant, "--yes", "--data-dir", str(layout.root)]
    result = CliRunner().invoke(cli, args)
    return result.exit_code, result.output


def test_an_unknown_tenant_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    layout = DataLayout(tmp_path / "data")
    catalog = layout.open_catalog()
    create_key(catalog, tenant="acme", region="EU", principals=["group:bot"])
    code, output = delete(layout, "acme-typo")
    assert code == 1, output
    assert f"no tenant acme-typo in {layout.root}" in output
    assert "removed" not in output and "erased" not in output
    assert catalog.erasures.open() == []  # no erasure requested for a tenant never here
    assert [k.tenant for k in catalog.api_keys()] == ["acme"]


def test_a_tenant_of_keys_only_or_directory_entries_only_is_deleted(tmp_path: Path) -> None:
    layout = DataLayout(tmp_path / "data")
    catalog = layout.open_catalog()
    create_key(catalog, tenant="acme", region="EU", principals=["group:bot"], scope="ingest")
    catalog.directory.create_user("globex", UserFields(user_name="dana"))
    code, output = delete(layout, "acme")
    assert code == 0, output
    assert "1 API keys" in output and "erased (nothing indexed yet)" in output
    assert catalog.api_keys() == []
    code, output = delete(layout, "globex")
    assert code == 0, output
    assert "1 directory entries removed" in output
    assert catalog.directory.entry("globex", "userName", "dana") is None
    code, output = delete(layout, "globex")  # deleted, and done: nothing of it is left
    assert code == 1 and "no tenant globex" in output


def test_a_delete_cut_short_before_its_erasure_is_finished_by_running_it_again(
    tmp_path: Path,
) -> None:
    """Its rows gone, its erasure requested but not run (the command was killed): the
    tenant still has something here, and running the command again erases it."""
    layout = DataLayout(tmp_path / "data")
    catalog = layout.open_catalog()
    catalog.erasures.request("acme", "tenant")
    code, output = delete(layout, "acme")
    assert code == 0, output
    assert "erased (nothing indexed yet)" in output and catalog.erasures.open() == []
