"""The catalog: documents, chunks and index generations in SQL (and, beside it, the queue of
ingest jobs in jobs.py and the serving replicas in replicas.py: the only other modules
that import sqlmodel).

SQLite in the data dir by default; the same models run on PostgreSQL. A generation row is
written in the same transaction as the documents it introduces, which makes that commit the
moment an ingest becomes visible.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from sqlalchemy import Connection, Engine, Index, bindparam, event, func, insert, tuple_, update
from sqlalchemy import select as columns_of  # sqlmodel's select takes four columns at most
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import defer
from sqlmodel import Field, Session, SQLModel, col, create_engine, delete, select

from gateway.domain import (
    Chunk,
    Document,
    Visibility,
    split_version_key,
    version_key,
    version_label,
)
from gateway.errors import GatewayError
from gateway.storage.audit import AuditTrail
from gateway.storage.directory import Directory
from gateway.storage.directory_versions import DirectoryVersions
from gateway.storage.erasures import Erasures, request_on
from gateway.storage.jobs import JobQueue
from gateway.storage.lease import GenerationLock
from gateway.storage.owners import Owners
from gateway.storage.replicas import Replicas
from gateway.storage.schema import ensure_current
from gateway.storage.slices import EmbedSlices

CONNECT_TIMEOUT_S = 5

# Statements run inside the transaction that commits a generation, told its number and how
# many chunks each version it adds got (by `version_key`).
InTransaction = Callable[[Connection, int, Mapping[str, int]], None]


class DocumentRow(SQLModel, table=True):
    __tablename__ = "documents"
    tenant: str = Field(primary_key=True)  # a version is (tenant, doc_id, version)
    # Indexed alone too: the key leads with the tenant, and plans select by doc_id lists.
    doc_id: str = Field(primary_key=True, index=True)
    version: str = Field(primary_key=True)
    title: str
    uri: str
    region: str
    acl_json: str
    effective_from: dt.date
    effective_to: dt.date | None = None
    closed_by: str | None = None  # `doc_id@version` (same tenant) whose ingest closed this one
    content_hash: str
    source: str
    text: str
    generation: int = Field(index=True)
    # Who pushed this version through the push API (a subject, `key:<id>` for a key); None
    # for `gateway ingest` and versions written before it was recorded (owners.py).
    pushed_by: str | None = None

    @property
    def key(self) -> str:
        return version_key(self.tenant, self.doc_id, self.version)

    @property
    def label(self) -> str:
        return version_label(self.doc_id, self.version)

    @property
    def visibility(self) -> Visibility:
        return Visibility(
            tenant=self.tenant,
            region=self.region,
            acl=tuple(json.loads(self.acl_json)),
            effective_from=self.effective_from,
            effective_to=self.effective_to,
        )


class ChunkRow(SQLModel, table=True):
    __tablename__ = "chunks"
    # A tenant's versions' chunks, never another tenant's (migration 0015).
    __table_args__ = (Index("ix_chunks_tenant_doc_id_version", "tenant", "doc_id", "version"),)
    tenant: str = Field(primary_key=True)  # chunk IDs are unique within a tenant
    chunk_id: str = Field(primary_key=True)
    doc_id: str = Field(index=True)
    version: str
    ordinal: int
    text: str
    token_count: int
    parent: int = 0  # section ordinal within the version: chunks with one parent are siblings
    # One packed unit vector per sentence of `text`, pooled at ingest (late chunking).
    sentence_vectors: bytes | None = None


class ChunkText(NamedTuple):
    """A chunk's row less its sentence vectors, as the expand stage reads it."""

    tenant: str
    chunk_id: str
    doc_id: str
    version: str
    ordinal: int
    text: str
    token_count: int
    parent: int


# The statements a request runs, built once and read as plain rows: through the ORM, the
# expand stage's two queries cost about 2.5 ms for ten documents, of which SQLite's own
# work was 0.2 ms (statement building and an ORM object per row took the rest).
# By tenant, doc_ids and versions, all three in the index (tenant, doc_id, version): by
# doc_id alone it read every tenant's chunks of a doc_id, so one tenant's expand stage took
# longer the more another tenant held under the same doc_id (invariant 13). The pairs are
# checked in Python: the lists' product may hold a version of the tenant's not asked for.
_CHUNKS_OF_VERSIONS = (
    columns_of(*(getattr(ChunkRow, name) for name in ChunkText._fields))
    .where(
        col(ChunkRow.tenant) == bindparam("tenant"),
        col(ChunkRow.doc_id).in_(bindparam("doc_ids", expanding=True)),
        col(ChunkRow.version).in_(bindparam("versions", expanding=True)),
    )
    .order_by(col(ChunkRow.ordinal))
)
_GENERATIONS_OF_DOCUMENTS = columns_of(
    col(DocumentRow.doc_id), col(DocumentRow.version), col(DocumentRow.generation)
).where(
    col(DocumentRow.tenant) == bindparam("tenant"),
    col(DocumentRow.doc_id).in_(bindparam("doc_ids", expanding=True)),
)


GENERATIONS = "generations"


class GenerationRow(SQLModel, table=True):
    __tablename__ = GENERATIONS
    id: int = Field(primary_key=True)
    created_at: dt.datetime
    lexical_dir: str
    vector_table: str = "chunks"  # a reindex writes a fresh table; others add versions
    vector_version: int
    model_name: str
    dim: int
    documents: int
    chunks: int
    # The numerics its vectors were embedded in, comma-separated (migration 0009).
    precisions: str = "float32"


@dataclass(frozen=True)
class Revision:
    """New visibility for an existing version, and the version that closed it, if any."""

    visibility: Visibility
    closed_by: str | None = None


class ApiKeyRow(SQLModel, table=True):
    """A service caller's key. Only a hash of its secret is kept; the scope is fixed at
    creation: exactly these principals, in this tenant and region."""

    __tablename__ = "api_keys"
    key_id: str = Field(primary_key=True)
    secret_hash: str
    name: str
    tenant: str
    region: str
    principals_json: str
    scope: str = "search"  # "search": the read routes; "ingest": the ingest routes only
    doc_prefix: str | None = None  # an ingest key may be limited to doc_ids starting so
    created_at: dt.datetime
    expires_at: dt.datetime | None = None
    revoked_at: dt.datetime | None = None

    @property
    def principals(self) -> tuple[str, ...]:
        return tuple(json.loads(self.principals_json))


def _sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):  # type: ignore[no-untyped-def]
        # WAL lets the server read while a separate ingest process writes.
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=10000")
        # A deleted row's bytes are overwritten, not left in a free page for anyone reading
        # the file (docs/security.md, "Erasure"); the erasure then empties the WAL file.
        cursor.execute("PRAGMA secure_delete=ON")
        cursor.close()


class _OwnConnection:
    """An SQLite connection of the catalog's own (autocommit) for the question every request
    asks, which generation is the newest: a few microseconds, against 0.2 ms through the
    engine. (Caching the answer until `PRAGMA data_version` moved saved nothing: every
    request's audit record is a commit from another connection.)"""

    def __init__(self, path: str) -> None:
        self._connection = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()

    def newest_generation(self) -> int | None:
        with self._lock:
            found = self._connection.execute(f"SELECT max(id) FROM {GENERATIONS}").fetchone()
        return None if found[0] is None else int(found[0])


class Catalog:
    def __init__(self, url_or_path: str | Path) -> None:
        self.engine = open_engine(url_or_path)
        ensure_current(self.engine)
        path = self.engine.url.database
        on_disk = self.engine.dialect.name == "sqlite" and path not in (None, "", ":memory:")
        self._own = _OwnConnection(str(path)) if on_disk else None
        # Whether asking for the current generation on every request costs (nearly)
        # nothing; a database server costs a round trip, so a server polls it instead.
        self.cheap_generation_check = self._own is not None
        self.jobs = JobQueue(self.engine)
        self.replicas = Replicas(self.engine)
        self.audit = AuditTrail(self.engine)
        self.owners = Owners(self.engine)
        self.directory = Directory(self.engine)
        self.directory_versions = DirectoryVersions(self.engine, self.directory, self.replicas)
        self.erasures = Erasures(self.engine)
        self.slices = EmbedSlices(self.engine)

    def current_generation_id(self) -> int | None:
        # Asked on every request: with SQLite, on the catalog's own connection.
        if self._own is not None:
            return self._own.newest_generation()
        with self.engine.connect() as connection:
            found: int | None = connection.execute(select(func.max(GenerationRow.id))).scalar()
        return found

    def current_generation(self) -> GenerationRow | None:
        with Session(self.engine) as s:
            return s.exec(select(GenerationRow).order_by(col(GenerationRow.id).desc())).first()

    def generations_from(self, first: int) -> list[GenerationRow]:
        """Generations `first` and newer, oldest first."""
        with Session(self.engine) as s:
            query = select(GenerationRow).where(col(GenerationRow.id) >= first)
            return list(s.exec(query.order_by(col(GenerationRow.id))).all())

    def versions_of(self, documents: Iterable[tuple[str, str]]) -> list[DocumentRow]:
        """Every version of each (tenant, doc_id)."""
        wanted = sorted(set(documents))
        rows: list[DocumentRow] = []
        with Session(self.engine) as s:
            for part in _parts(wanted):
                ids = sorted({doc_id for _, doc_id in part})  # lets SQLite use its index
                query = select(DocumentRow).where(
                    col(DocumentRow.doc_id).in_(ids),
                    tuple_(col(DocumentRow.tenant), col(DocumentRow.doc_id)).in_(part),
                )
                rows.extend(s.exec(query))
        return rows

    def tenants_of(self, doc_id: str) -> list[str]:
        """The tenants that have a document `doc_id` (for commands that select by ID)."""
        query = select(DocumentRow.tenant).where(col(DocumentRow.doc_id) == doc_id).distinct()
        with Session(self.engine) as s:
            return sorted(s.exec(query))

    def visibility_of(
        self, tenant: str, doc_id: str, version: str | None = None
    ) -> list[tuple[str, Visibility]]:
        """(version, visibility) of a tenant's versions of `doc_id` (or of one version): the
        visibility columns only, never the text, so deciding costs the same whether a
        version is large, small or absent."""
        query = columns_of(
            col(DocumentRow.version),
            col(DocumentRow.region),
            col(DocumentRow.acl_json),
            col(DocumentRow.effective_from),
            col(DocumentRow.effective_to),
        ).where(col(DocumentRow.tenant) == tenant, col(DocumentRow.doc_id) == doc_id)
        if version is not None:
            query = query.where(col(DocumentRow.version) == version)
        with self.engine.connect() as connection:
            return [
                (v, Visibility(tenant, region, tuple(json.loads(acl)), start, end))
                for v, region, acl, start, end in connection.execute(query)
            ]

    def tenants(self) -> list[str]:
        """Every tenant some version belongs to."""
        query = select(DocumentRow.tenant).distinct()
        with Session(self.engine) as s:
            return sorted(s.exec(query))

    def tenant_counts(self, tenant: str) -> tuple[int, int, int]:
        """(documents, versions, chunks) the catalog holds for `tenant`."""
        documents = columns_of(
            func.count(func.distinct(col(DocumentRow.doc_id))), func.count()
        ).where(col(DocumentRow.tenant) == tenant)
        chunks = columns_of(func.count()).where(col(ChunkRow.tenant) == tenant)
        with self.engine.connect() as connection:
            doc_ids, versions = connection.execute(documents).one()
            return int(doc_ids), int(versions), int(connection.execute(chunks).scalar() or 0)

    def visibilities(self, tenant: str | None = None) -> list[tuple[str, str, Visibility]]:
        """(doc_id, version, visibility) of every version (of one tenant's), without text:
        what a policy diff decides over."""
        query = columns_of(
            col(DocumentRow.tenant),
            col(DocumentRow.doc_id),
            col(DocumentRow.version),
            col(DocumentRow.region),
            col(DocumentRow.acl_json),
            col(DocumentRow.effective_from),
            col(DocumentRow.effective_to),
        )
        if tenant is not None:
            query = query.where(col(DocumentRow.tenant) == tenant)
        with self.engine.connect() as connection:
            return [
                (doc_id, v, Visibility(t, region, tuple(json.loads(acl)), start, end))
                for t, doc_id, v, region, acl, start, end in connection.execute(query)
            ]

    def superseded_before(self, day: dt.date) -> list[str]:
        """Keys of the versions a newer one closed, whose validity ended before `day`."""
        query = columns_of(
            col(DocumentRow.tenant), col(DocumentRow.doc_id), col(DocumentRow.version)
        ).where(col(DocumentRow.closed_by).is_not(None), col(DocumentRow.effective_to) < day)
        with self.engine.connect() as connection:
            return [version_key(t, d, v) for t, d, v in connection.execute(query)]

    def document(self, tenant: str, doc_id: str, version: str) -> DocumentRow | None:
        with Session(self.engine) as s:
            return s.get(DocumentRow, (tenant, doc_id, version))

    def chunk(self, tenant: str, chunk_id: str) -> ChunkRow | None:
        with Session(self.engine) as s:
            return s.get(ChunkRow, (tenant, chunk_id))

    def chunks_of(self, tenant: str, doc_id: str, version: str) -> list[ChunkText]:
        return self.chunks_of_versions(tenant, [(doc_id, version)])[(doc_id, version)]

    def chunks_of_versions(
        self, tenant: str, keys: Iterable[tuple[str, str]], as_of_generation: int | None = None
    ) -> dict[tuple[str, str], list[ChunkText]]:
        """The chunks of each (doc_id, version) of `tenant`, by ordinal, in one query; without their
        sentence vectors, which only the answerer reads (through `chunk_rows`).

        With `as_of_generation`, only versions no later generation has written or revised:
        their chunks are exactly what that generation holds. A request reads through this
        what its pinned generation has, never a newer text or visibility (a version changed
        since gives nothing, which fails closed)."""
        wanted = set(keys)
        out: dict[tuple[str, str], list[ChunkText]] = {key: [] for key in wanted}
        if not wanted:
            return out
        doc_ids = sorted({d for d, _ in wanted})
        versions = sorted({v for _, v in wanted})
        selected = {"tenant": tenant, "doc_ids": doc_ids, "versions": versions}
        with self.engine.connect() as connection:
            changed = _written_after(connection, tenant, doc_ids, as_of_generation)
            for found in connection.execute(_CHUNKS_OF_VERSIONS, selected):
                row = ChunkText._make(found)
                key = (row.doc_id, row.version)
                if key in wanted and key not in changed:
                    out[key].append(row)
        return out

    def chunk_rows(
        self, tenant: str, chunk_ids: Sequence[str], as_of_generation: int | None = None
    ) -> dict[str, ChunkRow]:
        """Whole chunk rows of `tenant`; `as_of_generation` as for `chunks_of_versions`."""
        with Session(self.engine) as s:
            query = select(ChunkRow).where(
                col(ChunkRow.tenant) == tenant, col(ChunkRow.chunk_id).in_(list(chunk_ids))
            )
            rows = list(s.exec(query))
            doc_ids = {r.doc_id for r in rows}
            changed = _written_after(s.connection(), tenant, doc_ids, as_of_generation)
            return {r.chunk_id: r for r in rows if (r.doc_id, r.version) not in changed}

    def tenant_chunks(self, tenant: str, batch: int = 5000) -> Iterator[list[Chunk]]:
        """Every chunk of `tenant` as the index holds it (title, URI and visibility from its
        version), in batches of about `batch` that never split a version: what an erasure
        writes the tenant's lexical partitions again from."""
        versions = columns_of(
            col(DocumentRow.doc_id),
            col(DocumentRow.version),
            col(DocumentRow.title),
            col(DocumentRow.uri),
            col(DocumentRow.region),
            col(DocumentRow.acl_json),
            col(DocumentRow.effective_from),
            col(DocumentRow.effective_to),
        ).where(col(DocumentRow.tenant) == tenant)
        query = (
            select(ChunkRow)
            .options(defer(ChunkRow.sentence_vectors))  # type: ignore[arg-type]
            .where(col(ChunkRow.tenant) == tenant)
            .order_by(col(ChunkRow.doc_id), col(ChunkRow.version), col(ChunkRow.ordinal))
        )
        with Session(self.engine) as s:
            seen = {
                (d, v): (title, uri, Visibility(tenant, region, tuple(json.loads(acl)), a, b))
                for d, v, title, uri, region, acl, a, b in s.connection().execute(versions)
            }
            out: list[Chunk] = []
            last: tuple[str, str] | None = None
            for c in s.exec(query.execution_options(yield_per=1000)):
                key = (c.doc_id, c.version)
                if key not in seen:
                    continue
                if len(out) >= batch and key != last:
                    yield out
                    out = []
                title, uri, visibility = seen[key]
                out.append(
                    Chunk(c.chunk_id, c.doc_id, c.version, c.ordinal, title, uri, c.text,
                          c.token_count, visibility, c.parent)
                )  # fmt: skip
                last = key
            if out:
                yield out

    def add_api_key(self, row: ApiKeyRow) -> None:
        with Session(self.engine, expire_on_commit=False) as s:  # the caller keeps using row
            s.add(row)
            s.commit()

    def api_key(self, key_id: str) -> ApiKeyRow | None:
        with Session(self.engine) as s:
            return s.get(ApiKeyRow, key_id)

    def api_keys(self) -> list[ApiKeyRow]:
        with Session(self.engine) as s:
            return list(s.exec(select(ApiKeyRow).order_by(col(ApiKeyRow.created_at))))

    def revoke_api_key(self, key_id: str, at: dt.datetime) -> ApiKeyRow | None:
        """Mark a key revoked (once; a second revoke keeps the first time)."""
        with Session(self.engine, expire_on_commit=False) as s:
            row = s.get(ApiKeyRow, key_id)
            if row is not None and row.revoked_at is None:
                row.revoked_at = at
                s.add(row)
                s.commit()
            return row

    def all_documents(self) -> list[DocumentRow]:
        with Session(self.engine) as s:
            return list(s.exec(select(DocumentRow)))

    def commit_generation(
        self,
        generation: GenerationRow,
        *,
        documents: Sequence[tuple[Document, str]],
        chunks: Sequence[Chunk],
        sentence_vectors: Mapping[str, bytes],
        revised: Mapping[str, Revision],
        deleted: Iterable[str] = (),
        within: InTransaction | None = None,
        lock: GenerationLock | None = None,
    ) -> None:
        """Write documents (with content hash), their chunks, revised visibility, deletions
        and the generation row in one transaction: before it commits, readers keep the
        previous generation. `within` adds statements of its own to that transaction (the
        jobs the generation finishes).

        With `lock` (PostgreSQL's generation lock, held by the writer), the transaction
        runs on the lock's own session, after checking that it still holds the lock: a
        writer that lost it (another may be writing the same number now) commits nothing
        (`generation_lock_lost`), and a session cut before its COMMIT rolls it back.

        Set-based statements, not ORM objects: building and flushing one object per row
        cost about 1.1 ms a chunk (110 s per 100k chunks); executemany costs a twentieth."""
        # A re-ingested version is deleted and written again whole, as a merge would.
        replaced = {*deleted, *(d.key for d, _ in documents)}
        number = generation.id
        fenced = lock.lost_if_cut(number) if lock else contextlib.nullcontext()
        with fenced, Session(self.engine if lock is None else lock.connection) as s:
            connection = s.connection()
            if lock is not None:
                lock.check(number)
            # Its old text stays on disk as a delete's does (Tantivy marks it deleted, the
            # old generations hold it): erased the same way.
            for tenant in _text_replaced(connection, documents):
                request_on(connection, tenant, "replaced")
            _delete_versions(connection, replaced)
            _insert_versions(connection, number, documents, chunks, sentence_vectors)
            _revise_versions(connection, number, revised)
            if within is not None:
                within(connection, number, Counter(c.version_key for c in chunks))
            s.add(generation)
            try:
                s.flush()
            except IntegrityError as exc:  # by a writer that does not check the lock
                raise generation_taken(number) from exc
            s.commit()


def generation_taken(number: int) -> GatewayError:
    """Generation `number` was committed by another writer meanwhile (one that does not
    check the generation lock: an older release during an upgrade). Transient: the write
    is retried on the new current generation."""
    return GatewayError(
        "catalog_unavailable",
        f"generation {number} was committed by another writer meanwhile: nothing of this "
        "write was committed; retry it",
    )


def _text_replaced(connection: Connection, documents: Sequence[tuple[Document, str]]) -> set[str]:
    """The tenants of the versions in `documents` the catalog holds with another text or
    title (a version sent again corrected): what is written over must be erased. Not
    another URI alone: the same text moved, which the result shows with its new link."""
    sent = {(d.visibility.tenant, d.doc_id, d.version): (h, d.title) for d, h in documents}
    tenants: set[str] = set()
    for part in _parts(sorted(sent)):
        ids = sorted({doc_id for _, doc_id, _ in part})  # lets SQLite use its index
        table = DocumentRow
        identity = tuple_(col(table.tenant), col(table.doc_id), col(table.version))
        query = columns_of(
            col(table.tenant),
            col(table.doc_id),
            col(table.version),
            col(table.content_hash),
            col(table.title),
        ).where(col(table.doc_id).in_(ids), identity.in_(part))
        for tenant, doc_id, version, *held in connection.execute(query):
            if tuple(held) != sent[(tenant, doc_id, version)]:
                tenants.add(tenant)
    return tenants


def _delete_versions(connection: Connection, keys: Iterable[str]) -> None:
    """Every row of the versions `keys` (`version_key`), chunks and documents."""
    for part in _parts([split_version_key(k) for k in sorted(keys)]):
        # The doc_id list lets SQLite use its index; a row-value IN alone scans.
        ids = sorted({doc_id for _, doc_id, _ in part})
        for table in (ChunkRow, DocumentRow):
            identity = tuple_(col(table.tenant), col(table.doc_id), col(table.version))
            connection.execute(delete(table).where(col(table.doc_id).in_(ids), identity.in_(part)))


def _insert_versions(
    connection: Connection,
    generation: int,
    documents: Sequence[tuple[Document, str]],
    chunks: Sequence[Chunk],
    sentence_vectors: Mapping[str, bytes],
) -> None:
    """The added versions' rows (with content hash) and their chunks'."""
    if documents:
        connection.execute(
            insert(DocumentRow), [_document_row(doc, h, generation) for doc, h in documents]
        )
    if chunks:
        connection.execute(
            insert(ChunkRow),
            [_chunk_row(chunk, sentence_vectors.get(chunk.scoped_id)) for chunk in chunks],
        )


def _revise_versions(
    connection: Connection, generation: int, revised: Mapping[str, Revision]
) -> None:
    """New visibility (and closer) of stored versions, recorded as changed in `generation`."""
    for key, revision in revised.items():
        tenant, doc_id, version = split_version_key(key)
        v = revision.visibility
        connection.execute(
            update(DocumentRow)
            .where(
                col(DocumentRow.tenant) == tenant,
                col(DocumentRow.doc_id) == doc_id,
                col(DocumentRow.version) == version,
            )
            .values(
                region=v.region,
                acl_json=json.dumps(v.acl),
                effective_from=v.effective_from,
                effective_to=v.effective_to,
                closed_by=revision.closed_by,
                generation=generation,
            )
        )


def _written_after(
    connection: Connection, tenant: str, doc_ids: Iterable[str], generation: int | None
) -> set[tuple[str, str]]:
    """(doc_id, version) of the tenant's versions written or revised after `generation`
    (none when it is None). Filtered here: a `generation` condition in SQL made SQLite
    walk the generation index over every document."""
    ids = sorted(set(doc_ids))
    if generation is None or not ids:
        return set()
    found = connection.execute(_GENERATIONS_OF_DOCUMENTS, {"tenant": tenant, "doc_ids": ids})
    return {(d, v) for d, v, written in found if written > generation}


def open_engine(url_or_path: str | Path) -> Engine:
    """An engine for a catalog URL (or the path of a SQLite file), its schema unchecked."""
    url = str(url_or_path)
    if "://" not in url:
        url = f"sqlite:///{Path(url).resolve()}"
    if not url.startswith("sqlite"):
        return _server_engine(url)
    engine = create_engine(url)
    _sqlite_pragmas(engine)
    _unavailable_as_503(engine)
    return engine


@functools.cache
def _server_engine(url: str) -> Engine:
    """One engine, and so one connection pool, per database server URL in a process: a
    catalog is opened in many places, and a pool each would open connections without end.
    Connections are checked before use, and never waited for long."""
    engine = create_engine(
        url, pool_pre_ping=True, connect_args={"connect_timeout": CONNECT_TIMEOUT_S}
    )
    _unavailable_as_503(engine)
    return engine


# SQLSTATE classes of a PostgreSQL that is away for now, or that rolled a transaction back
# for a conflict a retry resolves: 08 connection exception, 40 transaction rollback
# (deadlock, serialization), 53 insufficient resources (too many connections, disk full),
# 57 operator intervention (shutdown, restart, a statement timeout), 58 system error (I/O).
# Any other class, 54 "index row size exceeds maximum" among them, is the statement's own
# fault: reported as `catalog_unavailable` it was retried for ever and looked like an outage.
_OUTAGE_CLASSES = ("08", "40", "53", "57", "58")
# SQLite's like of them: another connection holds the lock past busy_timeout, the file cannot
# be opened, I/O failed, the disk is full, the file cannot be written. Any other
# OperationalError ("no such table", "duplicate column name") is the statement's or the
# schema's own fault: reported as `catalog_unavailable`, an upgrade that could never pass
# told the operator to retry for ever.
_SQLITE_OUTAGES = (
    sqlite3.SQLITE_BUSY,
    sqlite3.SQLITE_LOCKED,
    sqlite3.SQLITE_CANTOPEN,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_FULL,
    sqlite3.SQLITE_READONLY,  # a restore owned by another user, a read-only mount
)


def _unavailable_as_503(engine: Engine) -> None:
    """A database that cannot be reached (down, restarting, unreachable) is the temporary
    condition `catalog_unavailable` (503) for every caller, never a 500; the pool checks
    connections before use, so the first request after it is back succeeds."""

    @event.listens_for(engine, "handle_error")
    def _on_error(context):  # type: ignore[no-untyped-def]
        if context.is_disconnect or _outage(context):
            detail = _outage_detail(context.original_exception)
            raise GatewayError("catalog_unavailable", detail) from context.original_exception


def _outage(context: ExceptionContext) -> bool:
    if not isinstance(context.sqlalchemy_exception, OperationalError):
        return False
    original = context.original_exception
    if isinstance(original, sqlite3.Error):  # the extended code's low byte is the primary one
        return getattr(original, "sqlite_errorcode", 0) & 0xFF in _SQLITE_OUTAGES
    # No SQLSTATE: a connection psycopg could not make (refused, timed out).
    sqlstate = getattr(original, "sqlstate", None)
    return sqlstate is None or str(sqlstate)[:2] in _OUTAGE_CLASSES


def _outage_detail(original: BaseException) -> str:
    """What an outage's problem says: the reason where the database gave one that an
    operator acts on, else that it cannot be reached. A full disk said only the latter,
    and sent operators looking for a database that was down."""
    if isinstance(original, sqlite3.Error):
        primary = getattr(original, "sqlite_errorcode", 0) & 0xFF
        if primary == sqlite3.SQLITE_FULL:
            return "the catalog's disk is full"
        if primary == sqlite3.SQLITE_IOERR:
            return "the catalog's disk failed (I/O error)"
        if primary == sqlite3.SQLITE_READONLY:
            return "the catalog cannot be written (read-only: check the data dir's owner and mount)"
    elif getattr(original, "sqlstate", None) == "53100":  # PostgreSQL's disk_full
        return "the database server's disk is full"
    return "the catalog database cannot be reached; retry shortly"


def _parts(keys: Sequence[tuple[str, ...]], size: int = 500) -> Iterable[Sequence[tuple[str, ...]]]:
    """Keys in slices that keep each statement under the database's parameter limit."""
    for start in range(0, len(keys), size):
        yield keys[start : start + size]


def _chunk_row(chunk: Chunk, sentence_vectors: bytes | None) -> dict[str, object]:
    return {
        "tenant": chunk.visibility.tenant,
        "chunk_id": chunk.chunk_id,
        "doc_id": chunk.doc_id,
        "version": chunk.version,
        "ordinal": chunk.ordinal,
        "text": chunk.text,
        "token_count": chunk.token_count,
        "parent": chunk.parent,
        "sentence_vectors": sentence_vectors,
    }


def _document_row(doc: Document, content_hash: str, generation: int) -> dict[str, object]:
    v = doc.visibility
    return {
        "doc_id": doc.doc_id,
        "version": doc.version,
        "title": doc.title,
        "uri": doc.uri,
        "tenant": v.tenant,
        "region": v.region,
        "acl_json": json.dumps(list(v.acl)),
        "effective_from": v.effective_from,
        "effective_to": v.effective_to,
        "closed_by": None,
        "content_hash": content_hash,
        "source": doc.source,
        "text": doc.text,
        "generation": generation,
        "pushed_by": None,  # the push's writer records it in the same transaction (owners.py)
    }
