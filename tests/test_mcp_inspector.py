"""The MCP Inspector's CLI (npm @modelcontextprotocol/inspector, pinned by the lockfile in
tests/mcp_inspector/) against a real `gateway serve`: a client no one here wrote lists the
tools and calls `search` as the token's caller, over the initialize handshake (the CLI's
protocol era for a URL) that the SDK's own client does not use by default.

`make test` installs the CLI first (`make inspector`, an `npm ci`); run alone without it,
the tests skip and say so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.callers import ALICE
from tests.helpers.datadirs import copy_data_dir
from tests.helpers.identity import AUDIENCE, ISSUER, TokenFactory, bearer
from tests.helpers.processes import gateway_env, running_server

pytestmark = pytest.mark.server

PACKAGE = Path(__file__).parent / "mcp_inspector"
LAUNCHER = PACKAGE / "node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js"
QUERY = "How quickly are refunds paid? RPL-14"


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, data_dir: Path, jwks_file: Path
) -> Iterator[str]:
    root = tmp_path_factory.mktemp("inspected")
    env = gateway_env(
        GATEWAY_DATA_DIR=str(copy_data_dir(data_dir, root / "data")),
        GATEWAY_OIDC_ISSUER=ISSUER,
        GATEWAY_OIDC_AUDIENCE=AUDIENCE,
        GATEWAY_JWKS_URI=jwks_file.as_uri(),
    )
    with running_server(env) as (base, _process):
        yield base


def inspector(base: str, token: str, home: Path, *args: str) -> Any:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH: the MCP Inspector needs it")
    if not LAUNCHER.exists():
        pytest.skip("the MCP Inspector is not installed: run `make inspector`")
    command = [node, str(LAUNCHER), "--cli", f"{base}/mcp", "--transport", "http"]
    command += ["--header", f"Authorization: Bearer {token}", *args, "--format", "json"]
    # Its own HOME: the CLI keeps an OAuth store and a catalog under ~/.mcp-inspector.
    env = {**os.environ, "HOME": str(home), "NO_COLOR": "1"}
    ran = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert ran.returncode == 0, (ran.returncode, ran.stdout[-2000:], ran.stderr[-2000:])
    return json.loads(ran.stdout)  # {"result": ...}, the JSON-RPC result


def test_the_inspector_lists_the_tools_and_searches_as_the_caller(
    served: str, make_token: TokenFactory, tmp_path: Path
) -> None:
    token = make_token(**ALICE)
    listed = inspector(served, token, tmp_path, "--method", "tools/list")
    tools = {t["name"]: t for t in listed["result"]["tools"]}
    assert set(tools) == {"search", "fetch", "answer"}
    assert tools["search"]["inputSchema"]["properties"]["top_k"]["maximum"] == 50
    called = inspector(
        served,
        token,
        tmp_path,
        "--method",
        "tools/call",
        "--tool-name",
        "search",
        "--tool-args-json",
        json.dumps({"query": QUERY, "top_k": 3}),
    )
    result = called["result"]
    assert result.get("isError") is not True
    ids = [r["id"] for r in result["structuredContent"]["results"]]
    searched = httpx.post(
        f"{served}/search", json={"query": QUERY, "top_k": 3}, headers=bearer(token), timeout=60
    ).json()
    assert ids == [r["chunk_id"] for r in searched["results"]]
    assert "refund-policy@2:0" in ids
