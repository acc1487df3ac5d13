"""The checked-in openapi.yaml is what the app serves; it drifts only with a failing test."""

from __future__ import annotations

from pathlib import Path

import yaml

from gateway.api.openapi import render

CHECKED_IN = Path(__file__).resolve().parent.parent / "openapi.yaml"


def test_checked_in_openapi_matches_the_app() -> None:
    assert CHECKED_IN.read_text() == render(), "run `make openapi` and commit openapi.yaml"


def test_contract_routes_and_problem_responses() -> None:
    schema = yaml.safe_load(render())
    assert set(schema["paths"]) == {
        "/healthz",
        "/readyz",
        "/search",
        "/answer",
        "/documents/{doc_id}",
        "/chunks/{chunk_id}",
        "/admin/policy",
        "/admin/policy/reload",
        "/admin/explain",
        "/admin/documents/{doc_id}",
        "/admin/documents/{doc_id}/acl",
    }
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            for status, response in operation["responses"].items():
                if status.startswith(("4", "5")):
                    assert set(response["content"]) == {"application/problem+json"}, path
    answer = schema["components"]["schemas"]["AnswerResponse"]["properties"]
    assert {"answer", "abstained", "abstain_reason", "citations", "timings_ms"} <= set(answer)
