"""Who pushed each document version, and so what an ingest key may change.

The writer records the subject of the push that wrote a version (`documents.pushed_by`) in
the transaction that commits it. An ingest key may push, change the ACL of, or delete a
document only when every version of it that the catalog holds, and every copy of it in a
queued or running job, came from that key: a key cannot replace, re-permission or delete
what an admin, `gateway ingest` or another key wrote (403 `not_owner`, see
docs/security.md, "Ingest keys change only what they pushed"). Versions with no recorded
pusher (from `gateway ingest`, or written before pushers were recorded) are handed to a
key by an operator, `gateway keys adopt`: by default only those that came from the key's
own jobs (a pushed version's source names its job, and the job its submitter).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, and_, bindparam, column, func, select, table, update

from gateway.domain import split_version_key
from gateway.errors import GatewayError
from gateway.storage.jobs import PENDING, JobRow

# The catalog's documents table, by the columns read here (catalog.py imports this module).
_DOCUMENTS = table(
    "documents",
    column("tenant"),
    column("doc_id"),
    column("version"),
    column("pushed_by"),
    column("source"),
)
_PART = 500  # doc_ids per statement: under every database's parameter limit


class Owners:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @staticmethod
    def record(connection: Connection, pushers: Mapping[str, str]) -> None:
        """Each version (by `version_key`) was just written by this subject's push; on the
        connection of the transaction that writes it."""
        if not pushers:
            return
        rows = []
        for key, subject in sorted(pushers.items()):
            tenant, doc_id, version = split_version_key(key)
            rows.append({"t": tenant, "d": doc_id, "v": version, "by": subject})
        connection.execute(_set_pusher(bindparam("by"), tenant=bindparam("t")), rows)

    def foreign(self, tenant: str, doc_ids: Iterable[str], subject: str) -> list[str]:
        """The doc_ids among `doc_ids` that have a version, stored or queued, that
        `subject` did not push (sorted; empty when all are its own or new)."""
        wanted = sorted(set(doc_ids))
        d = _DOCUMENTS.c
        found: set[str] = set()
        with self.engine.connect() as connection:
            for start in range(0, len(wanted), _PART):
                part = wanted[start : start + _PART]
                query = select(d.doc_id, d.pushed_by).where(d.doc_id.in_(part), d.tenant == tenant)
                found |= {doc_id for doc_id, by in connection.execute(query) if by != subject}
            queued = select(JobRow.records_json).where(  # type: ignore[call-overload]
                JobRow.tenant == tenant,
                JobRow.status.in_(PENDING),  # type: ignore[attr-defined]
                JobRow.submitted_by != subject,
            )
            names = set(wanted)
            for (records,) in connection.execute(queued):
                found |= {r["doc_id"] for r in json.loads(records)} & names
        return sorted(found)

    def pushers(self, tenant: str, doc_ids: Iterable[str]) -> dict[str, set[str | None]]:
        """Who pushed the stored versions of each of these documents (None: unrecorded);
        a document with no stored version is absent."""
        wanted = sorted(set(doc_ids))
        d = _DOCUMENTS.c
        found: dict[str, set[str | None]] = {}
        with self.engine.connect() as connection:
            for start in range(0, len(wanted), _PART):
                part = wanted[start : start + _PART]
                query = select(d.doc_id, d.pushed_by).where(d.doc_id.in_(part), d.tenant == tenant)
                for doc_id, by in connection.execute(query):
                    found.setdefault(doc_id, set()).add(by)
        return found

    def refused(
        self, tenant: str, claim: Sequence[tuple[str, str, set[str]]], keys: set[str]
    ) -> dict[str, list[str]]:
        """Of a claim's jobs, (job_id, submitter, doc_ids) in order of arrival, those of
        ingest keys (`keys`) that carry a document with a version another subject pushed:
        stored, or in an earlier job of the claim that is written. The writer asks under
        its lock. Job -> those doc_ids (sorted)."""
        keyed = [d for _, subject, ids in claim if subject in keys for d in ids]
        pushers = self.pushers(tenant, keyed) if keyed else {}
        refused: dict[str, list[str]] = {}
        for job_id, subject, ids in claim:
            foreign = sorted(d for d in ids if pushers.get(d, set()) - {subject})
            if subject in keys and foreign:
                refused[job_id] = foreign
                continue
            for doc_id in ids:  # written: a later key's job carrying it is refused
                pushers.setdefault(doc_id, set()).add(subject)
        return refused

    def require(self, tenant: str, doc_ids: Iterable[str], subject: str) -> None:
        """403 `not_owner` unless every version of these documents is `subject`'s."""
        foreign = self.foreign(tenant, doc_ids, subject)
        if foreign:
            raise GatewayError(
                "not_owner",
                f"documents {foreign[:20]} have versions this key did not push (an admin's, "
                "`gateway ingest`'s or another key's); nothing was changed",
            )

    def adopt(self, tenant: str, subject: str, prefix: str | None, everything: bool = False) -> int:
        """Record `subject` as the pusher of the tenant's versions that have none (within
        `prefix`, when given) and that came from a job `subject` submitted, or, with
        `everything`, of all of them (`gateway ingest`'s, an admin's pushes); how many."""
        d = _DOCUMENTS.c
        where = and_(d.tenant == tenant, d.pushed_by.is_(None))
        with self.engine.begin() as connection:
            rows: Sequence[tuple[str, str, str]] = connection.execute(
                select(d.doc_id, d.version, d.source).where(where)
            ).all()
            rows = [r for r in rows if prefix is None or r[0].startswith(prefix)]
            if not everything:
                jobs = {_job_of(source) for _, _, source in rows} - {None}
                own = _submitted_by(connection, sorted(jobs), subject)  # type: ignore[arg-type]
                rows = [r for r in rows if _job_of(r[2]) in own]
            chosen = [{"d": i, "v": v} for i, v, _ in rows]
            if chosen:
                connection.execute(_set_pusher(subject, tenant=tenant, unowned=True), chosen)
        return len(chosen)

    def unowned(self, tenant: str) -> int:
        """How many of the tenant's versions have no recorded pusher."""
        d = _DOCUMENTS.c
        where = and_(d.tenant == tenant, d.pushed_by.is_(None))
        with self.engine.connect() as connection:
            found = connection.execute(select(func.count()).select_from(_DOCUMENTS).where(where))
            return int(found.scalar_one())


def _job_of(source: str) -> str | None:
    """The job a pushed version came from: its source reads `job <job_id> #<n>`."""
    parts = source.split(" ")
    return parts[1] if len(parts) == 3 and parts[0] == "job" else None


def _submitted_by(connection: Connection, job_ids: Sequence[str], subject: str) -> set[str]:
    """Of these jobs, those `subject` submitted."""
    found: set[str] = set()
    for start in range(0, len(job_ids), _PART):
        part = job_ids[start : start + _PART]
        query = select(JobRow.job_id).where(  # type: ignore[call-overload]
            JobRow.job_id.in_(part),  # type: ignore[attr-defined]
            JobRow.submitted_by == subject,
        )
        found |= {job_id for (job_id,) in connection.execute(query)}
    return found


def _set_pusher(by: object, *, tenant: object, unowned: bool = False) -> Any:
    """UPDATE of one version's pusher, its doc_id and version bound as `d` and `v`."""
    d = _DOCUMENTS.c
    where = [d.tenant == tenant, d.doc_id == bindparam("d"), d.version == bindparam("v")]
    if unowned:  # never takes a version from the key that pushed it
        where.append(d.pushed_by.is_(None))
    return update(_DOCUMENTS).where(*where).values(pushed_by=by)
