"""The whole API fuzzed from openapi.yaml by schemathesis against a real server, with the
credentials of a caller who is an admin and an operator, so every route is reached: no
response is a 5xx, and every response is one the document describes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.embedding import Embedder
from gateway.ingest.pipeline import ingest_paths
from gateway.storage.layout import DataLayout
from tests.helpers.callers import ROOT
from tests.helpers.documents import write_corpus
from tests.helpers.identity import AUDIENCE, ISSUER, TokenFactory
from tests.helpers.policies import write_policy
from tests.helpers.processes import gateway_env, running_server

pytestmark = [pytest.mark.server, pytest.mark.long]
ROOT_DIR = Path(__file__).resolve().parents[1]
# Examples per operation: 1,389 cases in all (most are the coverage phase's, which are
# fixed), about 40 CPU-s; at 50, 14 CPU-s more, a twentieth of make test's budget on two
# cores. A longer run sets FUZZ_EXAMPLES, or FUZZ_MAX_TIME (seconds): the fuzzing and
# stateful phases then repeat until it is spent.
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))
MAX_TIME = int(os.environ.get("FUZZ_MAX_TIME", "0"))
HANG_S = 180  # a request this long has hung: the only time this test judges

pytest.importorskip("schemathesis", reason="the dev extra installs schemathesis")

# 413 is how a body over the route's limit is refused, valid or not (the schema cannot say
# "at most 64 KiB"); it is documented on every route with a body.
CONFIG = """
[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422"]

[checks.positive_data_acceptance]
expected-statuses = ["2xx", "401", "403", "404", "409", "413"]

# A batch the schema admits can still break rules a schema cannot state (a version sent
# twice, an end before its start): 422, every problem listed. A full queue is 429.
[[operations]]
include-name = "POST /admin/documents"
[operations.checks.positive_data_acceptance]
expected-statuses = ["2xx", "401", "403", "409", "413", "422", "429"]

# A preview's files are policy YAML the schema can only call strings: one that does not
# load as a policy is 422 invalid_policy with its problems, which is the preview's answer.
[[operations]]
include-name = "POST /admin/policy/preview"
[operations.checks.positive_data_acceptance]
expected-statuses = ["2xx", "401", "403", "413", "422"]

# OpenAI's request schema admits what the gateway refuses by name (n > 1, tools, JSON
# output) and conversations without a user message: 400, as OpenAI answers them.
[[operations]]
include-name = "POST /v1/chat/completions"
[operations.checks.positive_data_acceptance]
expected-statuses = ["2xx", "400", "401", "403", "404", "413"]
"""


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, jwks_file: Path, embedder: Embedder
) -> Iterator[str]:
    # A data dir of its own: the fuzzer deletes documents and changes ACLs through the
    # ingest routes, which the tests sharing the session's data dir must not see.
    data_dir = tmp_path_factory.mktemp("fuzz-data")
    corpus = write_corpus(tmp_path_factory.mktemp("fuzz-corpus"))
    ingest_paths([corpus], DataLayout(data_dir), embedder)
    policy_dir = write_policy(tmp_path_factory.mktemp("fuzz-policy"))
    env = gateway_env(
        GATEWAY_DATA_DIR=str(data_dir),
        GATEWAY_POLICY_DIR=str(policy_dir),
        GATEWAY_POLICY_WATCH_INTERVAL_S="0",
        GATEWAY_OIDC_ISSUER=ISSUER,
        GATEWAY_OIDC_AUDIENCE=AUDIENCE,
        GATEWAY_JWKS_URI=jwks_file.as_uri(),
    )
    # With its writer: `?wait=true` answers once a job has ended.
    with running_server(env, worker=True) as (base, _process):
        yield base


def test_no_request_the_document_allows_gets_an_undocumented_answer(
    server: str, make_token: TokenFactory, tmp_path: Path
) -> None:
    token = make_token(**ROOT, ttl=3600 + MAX_TIME)
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    command = [
        str(Path(sys.executable).parent / "schemathesis"),
        "--config-file",
        str(config),
        "run",
        str(ROOT_DIR / "openapi.yaml"),
        "--url",
        server,
        "--header",
        f"Authorization: Bearer {token}",
        "--checks",
        "all",
        # `all` includes a response-time check (10 s unless set), which a loaded machine
        # fails on a `?wait=true` batch: its bound is the hang bound below, no other.
        "--max-response-time",
        str(HANG_S),
        "--max-examples",
        str(EXAMPLES),
        "--seed",
        "20261124",
        "--workers",
        "1",
        # This judges conformance, not speed: only a request that hangs fails its case (not
        # the whole run by the timeout below). A loaded machine may take many seconds over
        # a `?wait=true` batch, and that is no defect of the API.
        "--request-timeout",
        str(HANG_S),
        "--report",
        "junit",
        "--report-dir",
        str(tmp_path),
    ]
    if MAX_TIME:
        command += ["--max-time", str(MAX_TIME)]
    # In a scratch dir: schemathesis keeps a cache where it runs.
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=MAX_TIME + 900, cwd=tmp_path
    )
    (tmp_path / "schemathesis.txt").write_text(result.stdout)
    assert result.returncode == 0, result.stdout[-6000:]
