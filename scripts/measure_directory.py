"""Measure the directory (issue 30): the time to provision 10,000 users and 1,000 groups
through /scim/v2 over HTTP, as an identity provider's first sync would, and what the
directory adds to a `/search`.

The demo corpus is ingested into a data dir, served with a policy whose `directory` block
matches the token claim `uname` to `userName`. An identity provider's first sync is played
over HTTP on one kept-alive connection: each user looked up by filter and created, then each
group looked up, created empty and given its members by PATCH (30 per group, in one
operation, as Entra ID and Okta send memberships in batches). The user `u` is in 5 groups.
Then, on one server, `/search` with two tokens alternating query by query (embeddings cached
beforehand, untimed), alike but for `uname`: one names `u` (the directory's version check,
its cached entry, 5 more principals), the other has no `uname`, so the request does no
directory work at all (at most what a deployment without a directory does): p50/p95 of
both and the difference, in one process, so that two processes' noise is not measured.
Also the in-process cost of the directory check for `u` (a cache hit) over many calls.

Usage: PYTHONPATH=. python scripts/measure_directory.py [--users 10000] [--groups 1000]
       [--queries 300]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from gateway.authn.apikeys import create_key
from gateway.authn.directory import DirectoryIdentity
from gateway.bench.load import percentiles
from gateway.bench.server import gateway_command, running_gateway, throwaway_issuer
from gateway.policy.loader import DEFAULT_POLICY_DIR
from gateway.policy.model import Policy
from gateway.storage.layout import DataLayout

CORPUS = Path(__file__).resolve().parents[1] / "gateway" / "demo" / "corpus"
USER = "urn:ietf:params:scim:schemas:core:2.0:User"
GROUP = "urn:ietf:params:scim:schemas:core:2.0:Group"
PATCH = "urn:ietf:params:scim:api:messages:2.0:PatchOp"
PER_GROUP = 30
WORDS = ["policy", "who approves", "how long", "retention", "refunds", "EU", "staff"]


def corpus() -> tuple[str, tuple[str, ...], list[str]]:
    """The demo corpus' tenant, every group its ACLs name, and queries from its titles."""
    metas = []
    for path in sorted(CORPUS.glob("*.md")):
        head = path.read_text().split("---")[1]
        metas.append(
            dict(line.split(": ", 1) for line in head.strip().splitlines() if ": " in line)
        )
    groups = sorted({g for m in metas for g in re.findall(r'"group:([^"]+)"', m["acl"])})
    queries = [f"{m['title']} {WORDS[i % len(WORDS)]}" for i, m in enumerate(metas)]
    return metas[0]["tenant"], tuple(groups), queries


def provision(base: str, key: str, users: int, groups: int) -> tuple[float, float, dict[str, str]]:
    """(seconds for the users, seconds for the groups, userName -> id)."""
    ids: dict[str, str] = {}
    with httpx.Client(
        base_url=f"{base}/scim/v2", headers={"Authorization": f"Bearer {key}"}, timeout=60
    ) as scim:
        started = time.perf_counter()
        for n in range(users):
            name = "u" if n == 0 else f"user{n:05d}@corp.test"
            found = scim.get("/Users", params={"filter": f'userName eq "{name}"'})
            assert found.json()["totalResults"] == 0, found.text
            body = {
                "schemas": [USER],
                "userName": name,
                "externalId": f"ext-{n}",
                "active": True,
                "name": {"givenName": "G", "familyName": f"F{n}"},
                "emails": [{"value": f"{n}@corp.test", "type": "work", "primary": True}],
            }
            made = scim.post("/Users", json=body)
            assert made.status_code == 201, made.text
            ids[name] = made.json()["id"]
        users_s = time.perf_counter() - started
        everyone = list(ids.values())
        started = time.perf_counter()
        for g in range(groups):
            name = f"team-{g:04d}"
            found = scim.get("/Groups", params={"filter": f'displayName eq "{name}"'})
            assert found.json()["totalResults"] == 0, found.text
            made = scim.post("/Groups", json={"schemas": [GROUP], "displayName": name})
            assert made.status_code == 201, made.text
            members = [everyone[(g * PER_GROUP + i) % len(everyone)] for i in range(PER_GROUP)]
            if g < 5:  # the measured caller is in 5 groups
                members[0] = ids["u"]
            op = {"op": "add", "path": "members", "value": [{"value": m} for m in members]}
            patched = scim.patch(
                f"/Groups/{made.json()['id']}", json={"schemas": [PATCH], "Operations": [op]}
            )
            assert patched.status_code == 200, patched.text
        groups_s = time.perf_counter() - started
    return users_s, groups_s, ids


def check_cost(data: Path, tenant: str, calls: int = 20_000) -> float:
    """Microseconds per request of the directory check for a user it holds (a cache hit)."""
    catalog = DataLayout(data).open_catalog()
    identity = DirectoryIdentity(catalog.directory, catalog.directory_versions)
    claims = {"sub": "u", "uname": "u", "tenant": tenant, "region": "EU"}
    policy = Policy.model_validate({"directory": {"user_claim": "uname"}})
    identity.groups_for(claims, policy)
    started = time.perf_counter()
    for _ in range(calls):
        identity.groups_for(claims, policy)
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--groups", type=int, default=1_000)
    parser.add_argument("--queries", type=int, default=300, help="per server")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="measure-directory-"))
    directory = work / "data"
    subprocess.run(
        [gateway_command(), "ingest", str(CORPUS), "--data-dir", str(directory)],
        check=True,
        capture_output=True,
    )
    policy = work / "policy"
    policy.mkdir()
    text = (DEFAULT_POLICY_DIR / "policy.yaml").read_text()
    (policy / "policy.yaml").write_text(
        text + "\ndirectory:\n  user_claim: uname\n  user_attribute: userName\n"
    )
    tenant, groups, queries = corpus()
    key, _ = create_key(
        DataLayout(directory).open_catalog(), tenant=tenant, region="", principals=[], scope="scim"
    )
    issuer = throwaway_issuer(work, directory)
    env = {**issuer.env, "GATEWAY_POLICY_DIR": str(policy)}
    claims = {"iss": "https://m", "aud": "m", "sub": "u", "tenant": tenant, "region": "EU"}
    claims |= {"groups": list(groups), "exp": int(time.time()) + 3600}
    tokens = {
        "with directory": issuer.key.sign({**claims, "uname": "u"}),
        "without": issuer.key.sign(claims),
    }
    with running_gateway(["serve", "--no-worker"], env) as server:
        users_s, groups_s, _ = provision(server.base, key, args.users, args.groups)
    total = users_s + groups_s
    print(
        f"provisioned {args.users} users in {users_s:.1f} s ({args.users / users_s:.0f}/s), "
        f"{args.groups} groups x {PER_GROUP} members in {groups_s:.1f} s "
        f"({args.groups / groups_s:.0f}/s); first sync {total:.1f} s"
    )
    latencies: dict[str, list[float]] = {name: [] for name in tokens}
    with (
        running_gateway(["serve", "--no-worker"], env) as server,
        httpx.Client(base_url=server.base, timeout=60) as client,
    ):
        for q in queries:  # every embedding cached, untimed
            for token in tokens.values():
                auth = {"Authorization": f"Bearer {token}"}
                client.post("/search", json={"query": q, "top_k": 10}, headers=auth)
        for i in range(args.queries):
            q = queries[i % len(queries)]
            order = list(tokens) if i % 2 == 0 else list(tokens)[::-1]
            for name in order:
                auth = {"Authorization": f"Bearer {tokens[name]}"}
                started = time.perf_counter()
                response = client.post("/search", json={"query": q, "top_k": 10}, headers=auth)
                latencies[name].append((time.perf_counter() - started) * 1000)
                response.raise_for_status()
    stats = {name: percentiles(found, (50, 95)) for name, found in latencies.items()}
    for name, found in stats.items():
        print(f"/search {name:15} p50 {found['p50']:7.2f} ms  p95 {found['p95']:7.2f} ms")
    delta = stats["with directory"]["p50"] - stats["without"]["p50"]
    print(f"p50 delta (with - without): {delta:+.3f} ms")
    print(f"directory check per request (cache hit): {check_cost(directory, tenant):.1f} us")


if __name__ == "__main__":
    main()
