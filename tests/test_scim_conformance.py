"""SCIM conformance: `scim2-tester` (PyPI) runs its whole `check_server` against a real
`gateway serve` process over HTTP, with a key made by `gateway keys create --scope scim`:
no result may be ERROR or CRITICAL (a MUST of RFC 7643/7644 broken). The other statuses
are listed in docs/api.md, "Directory (SCIM 2.0)"."""

from __future__ import annotations

import collections
import re
from pathlib import Path

import httpx2
import pytest

from gateway.embedding import Embedder
from tests.helpers.datadirs import copy_data_dir
from tests.helpers.identity import AUDIENCE, ISSUER
from tests.helpers.processes import gateway_env, run_gateway, running_server

pytestmark = [pytest.mark.server]


def test_scim2_tester_finds_no_error(
    tmp_path: Path, data_dir: Path, jwks_file: Path, embedder: Embedder
) -> None:
    root = copy_data_dir(data_dir, tmp_path / "data")
    env = gateway_env(
        GATEWAY_DATA_DIR=str(root),
        GATEWAY_OIDC_ISSUER=ISSUER,
        GATEWAY_OIDC_AUDIENCE=AUDIENCE,
        GATEWAY_JWKS_URI=jwks_file.as_uri(),
    )
    made = run_gateway("keys", "create", "--tenant", "acme", "--scope", "scim", env=env)
    assert made.returncode == 0, made.stderr
    key = re.search(r"gk_\S+", made.stdout)
    assert key is not None, made.stdout
    # Imported here: scim2-client's models cost every xdist worker a second at collection.
    from scim2_client.engines.httpx2 import SyncSCIMClient
    from scim2_tester import Status, check_server

    with running_server(env) as (url, _):
        http = httpx2.Client(
            base_url=f"{url}/scim/v2",
            headers={"Authorization": f"Bearer {key.group(0)}"},
            timeout=60,
        )
        with http:
            results = list(check_server(SyncSCIMClient(http)))
    counts = collections.Counter(r.status.name for r in results)
    # The summary, as (docs/api.md, "Directory (SCIM 2.0)") quotes it.
    print("scim2-tester:", dict(sorted(counts.items())))
    for r in results:
        if r.status != Status.SUCCESS:
            print(r.status.name, r.title, r.reason)
    broken = [
        f"{r.status.name} {r.title}: {r.reason}"
        for r in results
        if r.status in (Status.ERROR, Status.CRITICAL)
    ]
    assert not broken, "\n".join(broken)
    assert counts["SUCCESS"] > 50  # it ran the resource checks, not discovery alone
