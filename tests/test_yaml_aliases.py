"""YAML anchors and aliases are refused wherever the gateway reads YAML (sidecars, front
matter, policy files), as they are met and naming the file and line: a few hundred bytes of
aliases otherwise expand to gigabytes. Refused values are named by type, never expanded."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.errors import GatewayError
from gateway.ingest.parse import DocumentsRefused
from gateway.ingest.sources import load_documents
from gateway.policy.loader import load_policy

STAFF_EU = "tenant: acme\nregion: EU\nacl: [group:staff]\neffective_from: 2020-01-01\n"


def alias_bomb(field: str, levels: int = 8) -> str:
    """Lists of nine aliases to the level below: 9**8 strings from 450 bytes."""
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return STAFF_EU + "\n".join(lines) + f"\n{field}: *a{levels - 1}\n"


def refused(folder: Path) -> list[tuple[str, str, str]]:
    with pytest.raises(DocumentsRefused) as caught:
        load_documents([folder])
    return [(p.source, p.field, p.message) for p in caught.value.problems]


def test_an_alias_bomb_in_a_sidecar_is_refused_at_once_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("The refund window is 30 days.\n")
    sidecar = tmp_path / "notes.txt.meta.yaml"
    sidecar.write_text(alias_bomb("effective_to"))
    assert len(sidecar.read_bytes()) < 500
    [(source, field, message)] = refused(tmp_path)
    assert source == str(sidecar) and field == "metadata"
    assert message == "invalid YAML at line 5: anchors and aliases (& and *) are not accepted"


def test_front_matter_with_an_anchor_is_refused(tmp_path: Path) -> None:
    (tmp_path / "memo.md").write_text(
        "---\ndoc_id: memo\n" + STAFF_EU + "title: &t Memo\nuri: *t\n---\nBody.\n"
    )
    [(source, field, message)] = refused(tmp_path)
    assert source.endswith("memo.md") and field == "front_matter"
    assert "line 7" in message and "anchors and aliases" in message


def test_nesting_past_the_bound_is_a_clear_refusal_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("Body.\n")
    (tmp_path / "notes.txt.meta.yaml").write_text(STAFF_EU + "x: " + "[" * 5000 + "]" * 5000)
    [(_, field, message)] = refused(tmp_path)
    assert field == "metadata" and "nested deeper than 64 levels" in message


def test_a_refused_value_is_named_by_its_type_not_printed(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("Body.\n")
    nested = "[" * 40 + '"secret-value"' + "]" * 40
    (tmp_path / "notes.txt.meta.yaml").write_text(
        STAFF_EU.replace("acl: [group:staff]", "acl: {a: 1}") + f"effective_to: {nested}\n"
    )
    messages = {field: message for _, field, message in refused(tmp_path)}
    assert messages["effective_to"] == "must be a date YYYY-MM-DD, got list"
    assert messages["acl"].endswith(", got dict")


def test_a_policy_file_with_aliases_is_refused_naming_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(
        "grants:\n- &g {group: staff, grants: ['support:eu']}\n- *g\n"
    )
    with pytest.raises(GatewayError) as caught:
        load_policy(tmp_path)
    assert caught.value.code == "invalid_policy"
    assert caught.value.detail == (
        f"{tmp_path / 'policy.yaml'}: not valid YAML at line 2: "
        "anchors and aliases (& and *) are not accepted"
    )
