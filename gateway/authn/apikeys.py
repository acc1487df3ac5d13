"""API keys for service callers: `gk_<key id>_<secret>`, stored as a hash, fixed in scope.

A key carries exactly the tenant, region and principals it was created with: no groups,
no grants, never admin, so a service cannot act as anybody it was not made to be. The
secret is 256 random bits, so one SHA-256 is enough to store it (no password stretching
needed), and it is compared in constant time. Every failure is the same 401 as a bad JWT.

An ingest key writes only documents it pushed itself (storage/owners.py) and, when created
with a doc_id prefix, only doc_ids that start with it (`key_may_write`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import logging
import re
import secrets
from collections.abc import Iterable, Sequence

from gateway.authn.tokens import GENERIC_DETAIL
from gateway.domain import MAX_TENANT_BYTES, Caller, canonical_name, principal_problem
from gateway.errors import GatewayError
from gateway.policy.model import Policy
from gateway.policy.resolve import readable_regions
from gateway.storage.catalog import ApiKeyRow, Catalog

PREFIX = "gk_"
SCOPES = ("search", "ingest", "scim")  # scim: the directory at /scim/v2, nothing else
KEY_ID_FORM = re.compile(r"[0-9a-f]{16}")  # secrets.token_hex(8), as `create_key` makes it
# A hundred years: further than any key should live, and well inside what a datetime can
# hold (a larger number would overflow it rather than be refused).
MAX_EXPIRES_DAYS = 36500
log = logging.getLogger("gateway.authn")


def is_api_key(token: str) -> bool:
    return token.startswith(PREFIX)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _utc(moment: dt.datetime | None) -> dt.datetime | None:
    """SQLite hands datetimes back without a zone; they were written in UTC."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=dt.UTC)


def create_key(
    catalog: Catalog,
    *,
    tenant: str,
    region: str,
    principals: Sequence[str],
    name: str = "",
    expires_days: int | None = None,
    scope: str = "search",
    doc_prefix: str | None = None,
) -> tuple[str, ApiKeyRow]:
    """A new key and its catalog row; the returned token is the only copy of the secret.
    A `search` key reads as its principals; an `ingest` key only writes its tenant's
    documents, so it needs no principal, and may be limited to doc_ids with `doc_prefix`."""
    problems = [
        f"principal {p!r:.60} {problem}"
        for p in principals
        if (problem := principal_problem(p)) is not None
    ]
    if scope not in SCOPES:
        problems.append(f"scope {scope!r} is not one of {', '.join(SCOPES)}")
    checked = (("tenant", tenant), ("region", region)) if scope != "scim" else (("tenant", tenant),)
    for field, value in checked:
        if not value.strip() or not value.isprintable() or value != value.strip():
            problems.append(f"{field} {value!r} is empty or has spaces or control characters")
        elif field == "tenant" and (size := len(value.encode())) > MAX_TENANT_BYTES:
            problems.append(f"tenant is {size} bytes in UTF-8; the limit is {MAX_TENANT_BYTES}")
    if not principals and scope == "search":
        problems.append("a search key needs at least one --principal")
    if principals and scope == "scim":
        problems.append("a scim key provisions the directory and reads nothing: no --principal")
    if doc_prefix is not None and scope != "ingest":
        problems.append("--doc-prefix limits ingest keys only")
    if doc_prefix is not None and (not doc_prefix or not doc_prefix.isprintable()):
        problems.append(f"doc prefix {doc_prefix!r} is empty or has control characters")
    if not name.isprintable():  # a line break would forge a line of `keys list`
        problems.append(f"name {name!r:.60} has control characters")
    if expires_days is not None and not 1 <= expires_days <= MAX_EXPIRES_DAYS:
        problems.append(f"--expires-days must be from 1 to {MAX_EXPIRES_DAYS}")
    if problems:
        raise ValueError("; ".join(problems))
    key_id = secrets.token_hex(8)  # the form of KEY_ID_FORM
    secret = secrets.token_urlsafe(32)
    now = dt.datetime.now(dt.UTC)
    row = ApiKeyRow(
        key_id=key_id,
        secret_hash=_hash(secret),
        name=name,
        tenant=tenant,
        region=region,
        principals_json=json.dumps(sorted({canonical_name(p) for p in principals})),
        scope=scope,
        doc_prefix=doc_prefix,
        created_at=now,
        expires_at=now + dt.timedelta(days=expires_days) if expires_days else None,
    )
    catalog.add_api_key(row)
    return f"{PREFIX}{key_id}_{secret}", row


def verify_key(catalog: Catalog, token: str, now: dt.datetime | None = None) -> ApiKeyRow:
    """The key's row, or the generic 401; the reason goes to the log, never the secret."""
    key_id, _, secret = token.removeprefix(PREFIX).partition("_")
    row = catalog.api_key(key_id) if key_id.isalnum() and secret else None
    reason = None
    if row is None:
        reason = "unknown key"
    elif not hmac.compare_digest(row.secret_hash, _hash(secret)):
        reason = "wrong secret"
    elif row.revoked_at is not None:
        reason = "revoked"
    elif (expires := _utc(row.expires_at)) is not None and expires <= (
        now or dt.datetime.now(dt.UTC)
    ):
        reason = "expired"
    if reason is not None or row is None:
        # The caller wrote what follows gk_: only a key ID of the form we generate is logged,
        # never text that could be part of a secret sent in the wrong shape.
        shown = repr(key_id) if KEY_ID_FORM.fullmatch(key_id) else "<malformed>"
        log.info("api key rejected: %s (key_id=%s)", reason, shown)
        raise GatewayError("unauthenticated", GENERIC_DETAIL)
    return row


def caller_for_key(row: ApiKeyRow, policy: Policy) -> Caller:
    """Exactly the key's scope; the policy only says which regions its region reads.
    Principals in NFC, as tokens' are compared (a key made before they were stored so)."""
    principals = [canonical_name(p) for p in row.principals]
    return Caller(
        subject=f"key:{row.key_id}",
        tenant=row.tenant,
        region=row.region,
        principals=frozenset(principals),
        readable_regions=readable_regions(row.region, policy),
        reasons=("api_key",),
        sources=tuple((p, "api_key") for p in principals),
        admin=False,
        kind="service",
        scope=row.scope,
        doc_prefix=row.doc_prefix,
    )


def key_may_write(catalog: Catalog, caller: Caller, doc_ids: Iterable[str]) -> None:
    """Nothing for an admin; for an ingest key, 403 `outside_doc_prefix` for a doc_id
    outside its prefix and 403 `not_owner` for a document with a version, stored or
    queued, that it did not push. Decides before anything is changed."""
    wanted = sorted(set(doc_ids))
    within_prefix(caller, wanted)
    if caller.scope == "ingest":
        catalog.owners.require(caller.tenant, wanted, caller.subject)


def within_prefix(caller: Caller, doc_ids: Iterable[str]) -> None:
    """403 `outside_doc_prefix` for an ingest key's doc_id outside its prefix."""
    prefix = caller.doc_prefix if caller.scope == "ingest" else None
    outside = [d for d in doc_ids if prefix is not None and not d.startswith(prefix)]
    if outside:
        raise GatewayError(
            "outside_doc_prefix",
            f"doc_ids {outside[:20]} do not start with this key's prefix {prefix!r}; "
            "nothing was changed",
        )


def pusher_of(caller: Caller) -> str | None:
    """The subject an ACL change or delete must have pushed the document as: an ingest
    key's own; None for an admin, who may change any of the tenant's documents."""
    return caller.subject if caller.scope == "ingest" else None
