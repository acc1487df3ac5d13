"""The demo: ingest the packaged Northwind corpus, mint tokens, serve on loopback.

Everything lives in one data dir: the catalog and indexes, the development issuer's key
and JWKS, and `demo.env` with the callers' tokens. The corpus is re-ingested only when its
files changed since the last run, so a second start is quick.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from gateway.authn.devissuer import DEV_AUDIENCE, DEV_ISSUER, DevIssuer, ensure_dev_issuer
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.ingest.pipeline import GenerationReport, ingest_paths
from gateway.settings import Settings
from gateway.storage.layout import DataLayout

DEMO_DIR = Path(__file__).resolve().parent
CORPUS_DIR = DEMO_DIR / "corpus"
POLICY_DIR = DEMO_DIR / "policy"
HOST = "127.0.0.1"  # the demo's tokens are printed on screen: never serve them beyond loopback
TENANT = "northwind"
FINGERPRINT_FILE = "demo-corpus.sha256"


@dataclass(frozen=True)
class DemoCaller:
    name: str  # also the token's subject
    region: str
    groups: tuple[str, ...]
    role: str
    admin: bool = False  # an admin of the tenant (the demo's policy: group policy-admins)

    @property
    def variable(self) -> str:
        return self.name.upper()


CALLERS = (
    DemoCaller("ana", "EU", ("staff",), "store associate in the EU"),
    DemoCaller("ben", "US", ("staff", "store-managers"), "store manager in the US"),
    DemoCaller("chen", "APAC", ("staff", "merchant-risk"), "merchant risk analyst in APAC"),
    DemoCaller("dana", "EU", ("staff", "policy-admins"), "policy admin in the EU", admin=True),
)
SAME_QUESTION = "How many days do customers have to return an item?"
RESTRICTED_QUESTION = "What does rule MRC-7781 say?"  # an EU merchant-risk rule
EXPLAIN_ANA = (
    '{"subject": {"sub": "ana", "tenant": "northwind", "region": "EU", "groups": ["staff"]}, '
    '"doc_id": "merchant-chargeback-limits-eu"}'
)


def corpus_fingerprint(corpus: Path = CORPUS_DIR) -> str:
    digest = hashlib.sha256()
    for path in sorted(corpus.glob("*.md")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def prepare_data(data_dir: Path, embedder: Embedder, progress: bool) -> GenerationReport | None:
    """Ingest the corpus unless this data dir already holds exactly this corpus."""
    marker = data_dir / FINGERPRINT_FILE
    fingerprint = corpus_fingerprint()
    layout = DataLayout(data_dir)
    try:
        current = layout.open_catalog().current_generation()
    except GatewayError as exc:
        if exc.code != "catalog_outdated":
            raise
        discard_index(layout)  # the demo's own index, from an earlier release: built again
        current = None
    if current is not None and marker.exists() and marker.read_text().strip() == fingerprint:
        return None
    report = ingest_paths([CORPUS_DIR], layout, embedder, progress=progress)
    marker.write_text(fingerprint + "\n")
    return report


def discard_index(layout: DataLayout) -> None:
    """Remove a data dir's catalog and indexes (the demo's issuer key stays)."""
    for name in ("catalog.db", "catalog.db-wal", "catalog.db-shm", FINGERPRINT_FILE):
        (layout.root / name).unlink(missing_ok=True)
    for directory in (layout.vectors, layout.lexical_root):
        shutil.rmtree(directory, ignore_errors=True)


def demo_settings(base: Settings, data_dir: Path) -> Settings:
    """The demo trusts its own issuer only; a GATEWAY_POLICY_DIR of the user's still wins."""
    jwks = ensure_dev_issuer(data_dir).jwks_path
    return base.model_copy(
        update={
            "data_dir": data_dir,
            "policy_dir": base.policy_dir or POLICY_DIR,
            "oidc_issuer": DEV_ISSUER,
            "oidc_audience": DEV_AUDIENCE,
            "jwks_uri": jwks.resolve().as_uri(),
            "dev_issuer": True,
        }
    )


def mint_tokens(issuer: DevIssuer) -> dict[DemoCaller, str]:
    return {c: issuer.mint(c.name, TENANT, c.region, list(c.groups)) for c in CALLERS}


def write_env(data_dir: Path, tokens: dict[DemoCaller, str]) -> Path:
    """`source demo.env` gives a shell the callers' tokens (mode 0600: they are credentials)."""
    path = data_dir / "demo.env"
    lines = [f"export {c.variable}={shlex.quote(t)}" for c, t in tokens.items()]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


def instructions(base_url: str, tokens: dict[DemoCaller, str], env_file: Path) -> str:
    """What to paste into another terminal while the demo runs."""
    out = [
        "",
        f"Northwind demo gateway on {base_url} (Ctrl-C stops it). Tokens, valid 12 hours:",
        "",
    ]
    for caller, token in tokens.items():
        groups = ", ".join(caller.groups)
        out.append(f"# {caller.name}: {caller.role} (tenant {TENANT}, groups: {groups})")
        out.append(f"export {caller.variable}={shlex.quote(token)}")
    out += ["", f"# or: source {env_file}", "", "# One question, three callers, three answers:"]
    for caller in tokens:
        if not caller.admin:
            out.append(_curl(base_url, caller.variable, "answer", SAME_QUESTION))
    out += ["", "# A rule only EU merchant risk may read: ana gets an abstention, not the rule:"]
    out.append(_curl(base_url, "ANA", "answer", RESTRICTED_QUESTION))
    out += ["", "# Ranked evidence with each lane's rank:"]
    out.append(_curl(base_url, "BEN", "search", "cash handling at the till", top_k=3))
    for caller, token in tokens.items():
        if caller.admin:  # the token is pasted, never put in the URL (it would stay in history)
            out += [
                "",
                f"# The console, as {caller.name} ({caller.role}): Try as, the policy preview.",
                f"# Open {base_url}/console and paste this token:",
                token,
                "",
                f"# Or ask as {caller.name} why ana does not see rule MRC-7781's document:",
                f'curl -s {base_url}/admin/explain -H "Authorization: Bearer ${caller.variable}" '
                f"-H 'content-type: application/json' -d '{EXPLAIN_ANA}'",
            ]
    return "\n".join(out) + "\n"


def _curl(base_url: str, variable: str, route: str, query: str, top_k: int | None = None) -> str:
    body = f'{{"query": "{query}"' + (f', "top_k": {top_k}' if top_k else "") + "}"
    return (
        f'curl -s {base_url}/{route} -H "Authorization: Bearer ${variable}" '
        f"-H 'content-type: application/json' -d '{body}'"
    )
