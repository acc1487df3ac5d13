"""A generation's lexical index: one Tantivy index per tenant, so no ranking statistic of
one tenant depends on another tenant's content.

BM25 weighs a term by how many documents hold it and a document by its length against the
average, both over the whole index it searches. In one shared index, another tenant's
documents moved a caller's scores and order (a score ratio went from 1.0 to 6.1 when 50
hidden chunks were added) and the lane's time with their volume. Each tenant's chunks
live in their own directory under the generation's, named by a hash of the tenant; a
search reads only the caller's. What remains is within a tenant: its documents a caller
may not see still count in its statistics (see docs/security.md).
"""

from __future__ import annotations

import hashlib
import threading
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from gateway.domain import Chunk, split_version_key
from gateway.restriction import Restriction
from gateway.storage.lexical import LexicalHit, StoredChunk, TantivyIndex, identifiers_in

PARTITION_PREFIX = "t-"


def partition_name(tenant: str) -> str:
    """A directory name for any tenant string (no path syntax can reach the file system)."""
    return PARTITION_PREFIX + hashlib.sha256(tenant.encode()).hexdigest()[:32]


class LexicalIndex:
    """A generation directory of per-tenant Tantivy indexes, opened as first needed."""

    def __init__(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._open: dict[str, TantivyIndex] = {}
        self._lock = threading.Lock()

    def _partition(self, tenant: str, create: bool = False) -> TantivyIndex | None:
        found = self._open.get(tenant)
        if found is not None:
            return found
        directory = self.path / partition_name(tenant)
        if not create and not directory.exists():
            return None  # a tenant without documents in this generation
        with self._lock:  # one opening per partition
            if tenant not in self._open:
                self._open[tenant] = TantivyIndex(directory)
            return self._open[tenant]

    # -- writes -------------------------------------------------------------------------

    def apply(self, delete_doc_keys: Iterable[str], add: Sequence[Chunk]) -> None:
        """Delete whole document versions and add chunks, one commit per tenant touched.
        The generation becomes visible only when the catalog records it, so per-tenant
        commits never show half a change."""
        deletes: dict[str, list[str]] = defaultdict(list)
        for key in delete_doc_keys:
            deletes[split_version_key(key)[0]].append(key)
        adds: dict[str, list[Chunk]] = defaultdict(list)
        for chunk in add:
            adds[chunk.visibility.tenant].append(chunk)
        for tenant in sorted(deletes.keys() | adds.keys()):
            partition = self._partition(tenant, create=bool(adds.get(tenant)))
            if partition is not None:
                partition.apply(deletes.get(tenant, ()), adds.get(tenant, ()))

    # -- reads: the caller's partition only ---------------------------------------------

    def search(
        self, restriction: Restriction, text: str, limit: int, stored: int = 0
    ) -> list[LexicalHit]:
        partition = self._partition(restriction.tenant)
        return [] if partition is None else partition.search(restriction, text, limit, stored)

    def search_identifiers(
        self, restriction: Restriction, text: str, limit: int
    ) -> list[LexicalHit]:
        partition = self._partition(restriction.tenant)
        return [] if partition is None else partition.search_identifiers(restriction, text, limit)

    def fetch(self, restriction: Restriction, chunk_ids: Sequence[str]) -> dict[str, StoredChunk]:
        partition = self._partition(restriction.tenant)
        return {} if partition is None else partition.fetch(restriction, chunk_ids)

    def filter_only(self, restriction: Restriction, limit: int = 1_000_000) -> set[str]:
        partition = self._partition(restriction.tenant)
        return set() if partition is None else partition.filter_only(restriction, limit)

    def identifiers(self, text: str) -> list[str]:
        return identifiers_in(text)

    def count(self) -> int:
        """Chunks in every partition."""
        return sum(TantivyIndex(d).count() for d in sorted(self.path.glob(f"{PARTITION_PREFIX}*")))
