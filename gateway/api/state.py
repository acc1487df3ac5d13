"""Long-lived services of one running app, built at startup (no import-time singletons)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from gateway.answer.pipeline import AnswerPipeline
from gateway.authn.tokens import TokenVerifier
from gateway.embedding import Embedder
from gateway.errors import GatewayError
from gateway.policy.loader import LoadedPolicy
from gateway.policy.store import PolicyStore
from gateway.retrieval.search import HybridSearcher
from gateway.settings import Settings
from gateway.storage.catalog import Catalog
from gateway.storage.generations import DataLayout, ServedIndex, open_served
from gateway.telemetry.tracing import Tracing

REFRESH_INTERVAL_S = 1.0  # how stale the served generation may be after an ingest commits


class IndexHolder:
    """The served generation; switches to a newer one when the catalog records it."""

    def __init__(self, layout: DataLayout, catalog: Catalog, embedder: Embedder) -> None:
        self._layout, self._catalog, self._embedder = layout, catalog, embedder
        self._lock = threading.Lock()
        self._served: ServedIndex | None = None
        self._checked = 0.0
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> ServedIndex | None:
        now = time.monotonic()
        if not force and now - self._checked < REFRESH_INTERVAL_S:
            return self._served
        with self._lock:
            self._checked = now
            current = self._catalog.current_generation()
            if current is not None and (self._served is None or self._served.number != current.id):
                self._served = open_served(
                    self._layout, self._catalog, self._embedder.name, self._embedder.dim
                )
        return self._served

    def get(self) -> ServedIndex:
        served = self.refresh()
        if served is None:
            raise GatewayError("not_ready", "no index generation yet: run `gateway ingest` first")
        return served


@dataclass
class AppState:
    settings: Settings
    policies: PolicyStore
    embedder: Embedder
    catalog: Catalog
    indexes: IndexHolder
    verifier: TokenVerifier
    searcher: HybridSearcher
    answers: AnswerPipeline
    tracing: Tracing
    warmed: bool = False

    @property
    def policy(self) -> LoadedPolicy:
        """The policy serving now; a request keeps the one that resolved its caller."""
        return self.policies.current
