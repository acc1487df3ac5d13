"""Dates in admin request bodies are days written YYYY-MM-DD (the OpenAPI `format: date`), as
the push API's and ingest's are: `as_of` of /admin/explain and /admin/policy/preview took
pydantic's lax reading, where "0" is 1970-01-01 and "86400" the day after, and answered
for that day as if it had been asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests import test_admin_api
from tests.helpers.callers import ROOT
from tests.helpers.identity import TokenFactory, bearer
from tests.test_policy_preview import edited

admin_client = test_admin_api.admin_client  # the serving app and its policy dir

NOT_DAYS = [0, "0", "86400", "1.5", "2026-11-29T00:00:00Z", "2026-11-29T00:00:00", "20261129"]


def explain(client: TestClient, token: str, as_of: Any) -> Any:
    subject = test_admin_api.claims_of("alice")
    body = {"subject": subject, "doc_id": "refund-policy", "as_of": as_of}
    return client.post("/admin/explain", json=body, headers=bearer(token))


def refused_as_of(response: Any) -> None:
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert "as_of" in response.text and "YYYY-MM-DD" in response.text


@pytest.mark.parametrize("as_of", NOT_DAYS)
def test_explain_refuses_an_as_of_that_is_not_a_day(
    admin_client: tuple[TestClient, Path], make_token: TokenFactory, as_of: Any
) -> None:
    client, _ = admin_client
    refused_as_of(explain(client, make_token(**ROOT), as_of))


def test_explain_and_preview_answer_for_a_day_and_preview_refuses_what_is_not_one(
    admin_client: tuple[TestClient, Path], make_token: TokenFactory
) -> None:
    client, policy_dir = admin_client
    root = make_token(**ROOT)
    answered = explain(client, root, "1970-01-02")
    assert answered.status_code == 200, answered.text
    assert answered.json()["as_of"] == "1970-01-02"

    def preview(as_of: Any) -> Any:
        body = {"files": edited(policy_dir), "as_of": as_of}
        return client.post("/admin/policy/preview", json=body, headers=bearer(root))

    assert preview("2030-01-01").status_code == 200
    for as_of in NOT_DAYS:
        refused_as_of(preview(as_of))
    no_such_day = preview("2026-02-30")  # well-formed, refused as before
    assert no_such_day.status_code == 422 and "as_of" in no_such_day.text
