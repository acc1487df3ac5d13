"""The checked-in JSON schema of policy files refuses what the loader refuses.

Editors check policy files against `policies/schema.json`; a value the schema lets pass
and `gateway policy check` then refuses is found only at deploy. `retrieval.weights`
(known lanes, weights of 0 or more) and `audit.required` (routes that leave an audit
record) are checked by validators the schema did not state.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from gateway import yamlload
from gateway.cli import app as cli

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "policies" / "schema.json").read_text())


def schema_refuses(text: str) -> bool:
    data = yamlload.load_policy_yaml(text.encode())
    return not jsonschema.Draft202012Validator(SCHEMA).is_valid(data)


def check_refuses(tmp_path: Path, text: str) -> bool:
    (tmp_path / "policy.yaml").write_text(text)
    result = CliRunner().invoke(cli, ["policy", "check", str(tmp_path)])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code == 1


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        ("retrieval: {weights: {dens: 2.0}}\n", True),  # a misspelt lane
        ("retrieval: {weights: {bm25: 1, dense: -5}}\n", True),
        ("retrieval: {weights: {bm25: true}}\n", True),
        ("retrieval: {weights: {bm25: 0, dense: 2.5, exact: 1}}\n", False),
        ("retrieval: {weights: {}}\n", False),
        ("audit: {required: [/serach]}\n", True),  # a typo of /search
        ("audit: {required: [search]}\n", True),  # not a route template
        ("audit: {required: [/documents/abc]}\n", True),  # a path, not its template
        ("audit: {required: [/search, /answer, '/documents/{doc_id}', /mcp]}\n", False),
        ("audit: {required: []}\n", False),
    ],
)
def test_the_schema_refuses_what_policy_check_refuses(
    tmp_path: Path, text: str, refused: bool
) -> None:
    assert check_refuses(tmp_path, text) is refused
    assert schema_refuses(text) is refused
