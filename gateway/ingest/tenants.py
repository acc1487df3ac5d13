"""Deletes that end in an erasure: a whole tenant, and superseded versions past retention.

`delete_tenant` first removes the tenant's keys, jobs and directory entries (so nothing
of it is written after its documents go), then its documents as one generation that
requests the erasure in its own transaction; the caller then erases (`holds_tenant` says
whether there is anything of a tenant to delete). `delete_superseded` deletes the versions
a newer version closed more than the policy's `retention.superseded_days` ago, the same
way.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, replace

from sqlalchemy import Connection, select
from sqlmodel import col

from gateway.domain import split_version_key, version_key
from gateway.ingest.writer import ChangeSet, Plan, write_generation
from gateway.storage.catalog import ApiKeyRow, Catalog, DocumentRow
from gateway.storage.directory_tables import GROUPS, USERS
from gateway.storage.erasures import request_on
from gateway.storage.jobs import JobRow
from gateway.storage.layout import DataLayout
from gateway.storage.slices import SliceRow
from gateway.storage.tenant_rows import TenantRows, remove_tenant_directory, remove_tenant_rows


@dataclass(frozen=True)
class TenantDeleted:
    versions: int
    chunks: int
    rows: TenantRows
    generation: int | None


def holds_tenant(catalog: Catalog, tenant: str) -> bool:
    """Whether the catalog holds anything of `tenant` that `delete_tenant` removes (a
    document version, an API key, a job or its vectors, a directory user, tombstone or
    group), or an erasure of it not done yet: a delete cut short, which running it again
    finishes. A tenant of none of these was never here, or is gone: a mistyped name."""
    columns = (
        col(DocumentRow.tenant),
        col(ApiKeyRow.tenant),
        col(JobRow.tenant),
        col(SliceRow.tenant),
        USERS.c.tenant,
        GROUPS.c.tenant,
    )
    with catalog.engine.connect() as connection:
        for column in columns:
            if connection.execute(select(column).where(column == tenant).limit(1)).first():
                return True
    return any(row.tenant == tenant for row in catalog.erasures.open())


def delete_tenant(layout: DataLayout, tenant: str) -> TenantDeleted:
    """Remove every key, job, document and directory entry of `tenant`, in that order, and
    request the erasure of its documents (due now). Running it again finishes what a
    crash left."""
    catalog = layout.open_catalog()
    rows = remove_tenant_rows(catalog.engine, tenant)
    _, versions, chunks = catalog.tenant_counts(tenant)

    def plan(catalog: Catalog) -> Plan:
        keys = [version_key(tenant, d, v) for d, v, _ in catalog.visibilities(tenant)]
        return Plan(ChangeSet(delete=frozenset(keys)))

    def request(connection: Connection, _: int, __: object) -> None:
        request_on(connection, tenant, "tenant", due_at=dt.datetime.now(dt.UTC))

    written = write_generation(layout, plan, within=request)
    if written.report is None:  # no documents (left): the rest may still hold its bytes
        catalog.erasures.request(tenant, "tenant", due_at=dt.datetime.now(dt.UTC))
    generation = written.report.generation if written.report else None
    # The directory last: while documents are served, deprovisioned users stay refused.
    rows = replace(rows, directory=remove_tenant_directory(catalog.engine, tenant))
    return TenantDeleted(versions=versions, chunks=chunks, rows=rows, generation=generation)


def delete_superseded(layout: DataLayout, days: int, today: dt.date | None = None) -> int:
    """Delete the versions superseded more than `days` days ago (their validity ended
    before then), requesting their erasure; how many. `today` is the day in UTC, as for
    every other decision on dates: the host's own zone may be a day ahead or behind."""
    cutoff = (today or dt.datetime.now(dt.UTC).date()) - dt.timedelta(days=days)
    found: list[str] = []

    def plan(catalog: Catalog) -> Plan:
        found[:] = catalog.superseded_before(cutoff)
        return Plan(ChangeSet(delete=frozenset(found)))

    def request(connection: Connection, _: int, __: object) -> None:
        tenants: dict[str, int] = defaultdict(int)
        for key in found:
            tenants[split_version_key(key)[0]] += 1
        for tenant in sorted(tenants):
            request_on(connection, tenant, "superseded")

    write_generation(layout, plan, within=request)
    return len(found)
