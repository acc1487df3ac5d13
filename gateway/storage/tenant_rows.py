"""A tenant's rows other than its documents: what `gateway tenant delete` removes besides.

Its API keys and its jobs (queued, running or ended) go in one transaction, first; its
directory entries (users, groups, memberships, former group names) last, once its
documents are deleted. Its audit records stay: they carry IDs only and follow the
policy's `audit.retention_days` (docs/security.md, "Erasure").
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, delete
from sqlmodel import Session, col

from gateway.storage.catalog import ApiKeyRow
from gateway.storage.directory_tables import delete_tenant_entries
from gateway.storage.jobs import JobRow
from gateway.storage.slices import SliceRow


@dataclass(frozen=True)
class TenantRows:
    keys: int
    jobs: int
    directory: int


def remove_tenant_rows(engine: Engine, tenant: str) -> TenantRows:
    """Delete the tenant's API keys and jobs, in one transaction (directory: 0)."""
    with Session(engine) as s:
        connection = s.connection()
        keys = connection.execute(delete(ApiKeyRow).where(col(ApiKeyRow.tenant) == tenant))
        # Vectors embedders handed over for the tenant's jobs go with the jobs.
        connection.execute(delete(SliceRow).where(col(SliceRow.tenant) == tenant))
        jobs = connection.execute(delete(JobRow).where(col(JobRow.tenant) == tenant))
        s.commit()
    return TenantRows(keys=keys.rowcount, jobs=jobs.rowcount, directory=0)


def remove_tenant_directory(engine: Engine, tenant: str) -> int:
    """Delete the tenant's directory entries; how many. Only once its documents are no
    longer served: until then its tombstones and inactive users must still refuse the
    tokens of the people they stand for."""
    with Session(engine) as s:
        removed = delete_tenant_entries(s.connection(), tenant)[1]
        s.commit()
    return removed
