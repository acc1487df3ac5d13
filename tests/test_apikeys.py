"""API keys for services: created, listed and revoked by the CLI, scoped to exactly their grant."""

from __future__ import annotations

import datetime as dt
import logging
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from gateway.api.app import create_app
from gateway.authn.apikeys import create_key, verify_key
from gateway.cli import app as cli
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.storage.layout import DataLayout
from tests.helpers.callers import HIDDEN_FROM_ALICE
from tests.helpers.identity import bearer, make_settings
from tests.helpers.policies import write_policy

KEY = re.compile(r"gk_[0-9a-f]{16}_[A-Za-z0-9_-]{43}")


def cli_key(data_dir: Path, *args: str) -> str:
    result = CliRunner().invoke(cli, ["keys", "create", "--data-dir", str(data_dir), *args])
    assert result.exit_code == 0, result.output
    found = KEY.search(result.output)
    assert found, result.output
    return found.group(0)


@pytest.fixture(scope="module")
def keyed(
    tmp_path_factory: pytest.TempPathFactory, data_dir: Path, jwks_file: Path, embedder: Embedder
) -> Iterator[TestClient]:
    # The policy names admins by subject and group; a key can never become one.
    policy = write_policy(tmp_path_factory.mktemp("policy"), admins={"subjects": ["key:x"]})
    with TestClient(create_app(make_settings(data_dir, jwks_file, policy), embedder=embedder)) as c:
        yield c


def test_key_sees_exactly_its_scope(keyed: TestClient, data_dir: Path) -> None:
    staff = cli_key(
        data_dir,
        "--tenant",
        "acme",
        "--region",
        "EU",
        "--principal",
        "group:staff",
        "--name",
        "bot",
    )
    payload = keyed.post(
        "/search", json={"query": "rule", "top_k": 100}, headers=bearer(staff)
    ).json()
    text = " ".join(r["text"] for r in payload["results"])
    assert "RPL-14" in text
    assert not any(code in text for code in HIDDEN_FROM_ALICE)
    # The policy grants staff members support:eu; a key holds only what it was given.
    risk = cli_key(
        data_dir, "--tenant", "acme", "--region", "EU", "--principal", "group:merchant-risk"
    )
    answer = keyed.post("/answer", json={"query": "merchants above MRX-7781"}, headers=bearer(risk))
    assert "merchant-fraud" in {c["doc_id"] for c in answer.json()["citations"]}
    refund = keyed.post("/search", json={"query": "RPL-14"}, headers=bearer(risk)).json()
    assert "refund-policy" not in {r["doc_id"] for r in refund["results"]}


def test_a_key_is_never_an_admin(keyed: TestClient, data_dir: Path) -> None:
    key = cli_key(data_dir, "--tenant", "acme", "--region", "EU", "--principal", "group:staff")
    assert keyed.get("/admin/policy", headers=bearer(key)).status_code == 403


def test_revoked_tampered_and_unknown_keys_look_like_any_bad_token(
    keyed: TestClient, data_dir: Path
) -> None:
    key = cli_key(data_dir, "--tenant", "acme", "--region", "EU", "--principal", "group:staff")
    assert keyed.post("/search", json={"query": "x"}, headers=bearer(key)).status_code == 200
    key_id = key.split("_")[1]
    listed = CliRunner().invoke(cli, ["keys", "list", "--data-dir", str(data_dir)])
    assert key_id in listed.output and key.split("_", 2)[2] not in listed.output
    revoked = CliRunner().invoke(cli, ["keys", "revoke", key_id, "--data-dir", str(data_dir)])
    assert revoked.exit_code == 0
    garbage = keyed.post("/search", json={"query": "x"}, headers=bearer("garbage"))
    for bad in (
        key,  # revoked: refused by the very next request
        key[:-1] + ("A" if key[-1] != "A" else "B"),
        "gk_0000000000000000_" + "A" * 43,
        "gk_",
        "gk_" + key_id,
    ):
        response = keyed.post("/search", json={"query": "x"}, headers=bearer(bad))
        assert response.status_code == 401
        assert response.content == garbage.content
    listed = CliRunner().invoke(cli, ["keys", "list", "--data-dir", str(data_dir)])
    assert re.search(rf"{key_id}\s+revoked", listed.output)


def test_secrets_are_stored_hashed(tmp_path: Path) -> None:
    catalog = DataLayout(tmp_path).open_catalog()
    token, row = create_key(catalog, tenant="acme", region="EU", principals=["group:staff"])
    secret = token.split("_", 2)[2]
    assert row.secret_hash != secret and len(row.secret_hash) == 64
    assert secret.encode() not in (tmp_path / "catalog.db").read_bytes()
    assert verify_key(catalog, token).key_id == row.key_id


def test_expired_key_is_refused(tmp_path: Path) -> None:
    catalog = DataLayout(tmp_path).open_catalog()
    token, _ = create_key(
        catalog, tenant="acme", region="EU", principals=["group:staff"], expires_days=1
    )
    assert verify_key(catalog, token).tenant == "acme"
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=2)
    with pytest.raises(GatewayError) as error:
        verify_key(catalog, token, now=later)
    assert error.value.code == "unauthenticated"


@pytest.mark.parametrize(
    "args",
    [
        ["--tenant", "acme", "--region", "EU", "--principal", "staff"],  # no kind prefix
        ["--tenant", " ", "--region", "EU", "--principal", "group:staff"],
        ["--tenant", "acme", "--region", "EU", "--principal", "group:a", "--expires-days", "0"],
    ],
)
def test_bad_key_requests_are_refused(tmp_path: Path, args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["keys", "create", "--data-dir", str(tmp_path), *args])
    assert result.exit_code == 1 and "key not created" in result.output
    assert DataLayout(tmp_path).open_catalog().api_keys() == []


def test_revoking_an_unknown_key_fails(tmp_path: Path) -> None:
    DataLayout(tmp_path).open_catalog()  # a data dir with a catalog, without that key
    result = CliRunner().invoke(cli, ["keys", "revoke", "nope", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1 and "no key" in result.output


def test_an_ingest_key_cannot_read_and_needs_no_principal(
    keyed: TestClient, data_dir: Path
) -> None:
    """`--scope ingest` makes a key for a tenant's connectors: it writes (the ingest routes)
    and reads nothing; a search key, the default, reads as its principals."""
    ingest = cli_key(data_dir, "--tenant", "acme", "--region", "EU", "--scope", "ingest")
    for method, path, body in (
        ("POST", "/search", {"query": "rule"}),
        ("POST", "/answer", {"query": "rule"}),
        ("GET", "/documents/refund-policy", None),
        ("GET", "/chunks/refund-policy@2:0", None),
    ):
        refused = keyed.request(method, path, json=body, headers=bearer(ingest))
        assert refused.status_code == 403, (path, refused.text)
        assert refused.json()["code"] == "forbidden"
    search = cli_key(data_dir, "--tenant", "acme", "--region", "EU", "--principal", "group:staff")
    assert keyed.post("/search", json={"query": "rule"}, headers=bearer(search)).status_code == 200
    listed = CliRunner().invoke(cli, ["keys", "list", "--data-dir", str(data_dir)])
    assert re.search(r"\bingest\b", listed.output) and re.search(r"\bsearch\b", listed.output)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scope", "admin", "--principal", "group:x"], "scope 'admin'"),
        (["--scope", "search"], "needs at least one --principal"),
        (["--principal", "group:x", "--doc-prefix", "hr-"], "--doc-prefix limits ingest keys"),
        (["--scope", "ingest", "--doc-prefix", ""], "doc prefix '' is empty"),
        # A line break in a name made `keys list` show a line no key has.
        (["--principal", "group:x", "--name", "ok\nkey_id active"], "has control characters"),
    ],
)
def test_a_key_scope_is_search_or_ingest(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(
        cli,
        ["keys", "create", "--data-dir", str(tmp_path), "--tenant", "a", "--region", "EU", *args],
    )
    assert result.exit_code == 1 and message in result.output


def test_an_ingest_key_may_be_limited_to_a_doc_prefix(tmp_path: Path) -> None:
    args = ["--tenant", "acme", "--region", "EU", "--scope", "ingest", "--doc-prefix", "hr-"]
    made = CliRunner().invoke(cli, ["keys", "create", "--data-dir", str(tmp_path), *args])
    assert made.exit_code == 0, made.output
    assert "created ingest key" in made.output and "for doc_ids starting 'hr-'" in made.output
    [row] = DataLayout(tmp_path).open_catalog().api_keys()
    assert row.doc_prefix == "hr-"
    listed = CliRunner().invoke(cli, ["keys", "list", "--data-dir", str(tmp_path)])
    assert re.search(rf"{row.key_id}\s+active\s+ingest\s.*\shr-$", listed.output, re.M)


@pytest.mark.parametrize("days", ["36501", "999999999"])
def test_a_key_cannot_be_made_to_outlive_a_hundred_years(tmp_path: Path, days: str) -> None:
    args = ["--tenant", "acme", "--region", "EU", "--principal", "group:a", "--expires-days", days]
    result = CliRunner().invoke(cli, ["keys", "create", "--data-dir", str(tmp_path), *args])
    # A clear refusal, not an OverflowError traceback (exit code 1 either way).
    assert result.exit_code == 1, result.output
    assert "key not created: --expires-days must be from 1 to 36500" in result.output
    assert DataLayout(tmp_path).open_catalog().api_keys() == []


def test_a_key_may_live_a_hundred_years(tmp_path: Path) -> None:
    catalog = DataLayout(tmp_path).open_catalog()
    token, row = create_key(
        catalog, tenant="acme", region="EU", principals=["group:a"], expires_days=36500
    )
    assert row.expires_at is not None and row.expires_at.year >= dt.date.today().year + 99
    assert verify_key(catalog, token).key_id == row.key_id


def test_only_a_key_id_of_the_generated_form_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What follows gk_ is the caller's: a secret pasted in the wrong shape must not reach
    the log, while the ID of a real key (or one of its form) still does."""
    catalog = DataLayout(tmp_path).open_catalog()
    _, row = create_key(catalog, tenant="acme", region="EU", principals=["group:a"])
    secret = "S3cret" + secrets.token_urlsafe(12).replace("_", "x")
    tokens = [f"gk_{secret}", f"gk_{secret}_x", f"gk_{row.key_id}_wrong", "gk_0123456789abcdef_x"]
    with caplog.at_level(logging.INFO, logger="gateway.authn"):
        for token in tokens:
            with pytest.raises(GatewayError):
                verify_key(catalog, token)
    assert [record.getMessage() for record in caplog.records] == [
        "api key rejected: unknown key (key_id=<malformed>)",
        "api key rejected: unknown key (key_id=<malformed>)",
        f"api key rejected: wrong secret (key_id={row.key_id!r})",
        "api key rejected: unknown key (key_id='0123456789abcdef')",
    ]


def test_a_doc_prefix_without_a_separator_at_its_end_is_made_with_a_note(tmp_path: Path) -> None:
    """`--doc-prefix acme-hr` is a plain string prefix, as documented, so it also covers
    `acme-hr2-payroll`: the key is made, and the note says so and what to use instead."""
    args = ["--tenant", "acme", "--region", "EU", "--scope", "ingest", "--doc-prefix"]
    made = CliRunner().invoke(
        cli, ["keys", "create", "--data-dir", str(tmp_path), *args, "acme-hr"]
    )
    assert made.exit_code == 0, made.output
    assert "gk_" in made.stdout
    assert "also writes doc_ids such as 'acme-hr2-x'" in made.stderr
    assert "'acme-hr-'" in made.stderr
    for prefix in ("acme-hr/", "acme:hr:", "acme_hr_", "acme.hr.", "acme-hr-"):
        quiet = CliRunner().invoke(
            cli, ["keys", "create", "--data-dir", str(tmp_path), *args, prefix]
        )
        assert quiet.exit_code == 0 and quiet.stderr == "", quiet.output
