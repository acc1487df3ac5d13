"""Long-lived services of one running app, built at startup (no import-time singletons)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.answer.pipeline import AnswerPipeline
from gateway.api.processes import SharedDir, WriterReport
from gateway.api.ratelimit import RateLimiter, SharedRateLimiter
from gateway.authn.directory import DirectoryIdentity
from gateway.authn.tokens import TokenVerifier
from gateway.embedding import Embedder
from gateway.ingest.supervisor import WriterSupervisor
from gateway.policy.gate import PreviewGate
from gateway.policy.loader import LoadedPolicy
from gateway.policy.store import PolicyStore
from gateway.retrieval.search import HybridSearcher
from gateway.settings import Settings
from gateway.storage.catalog import Catalog
from gateway.storage.current import ServedIndexes
from gateway.storage.layout import DataLayout
from gateway.telemetry.audit import AuditLog
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.tracing import Tracing

if TYPE_CHECKING:  # the MCP SDK stays imported by gateway.api.mcp alone
    from gateway.api.mcp import McpDoor


@dataclass
class AppState:
    settings: Settings
    layout: DataLayout
    policies: PolicyStore
    embedder: Embedder
    catalog: Catalog
    indexes: ServedIndexes
    verifier: TokenVerifier
    searcher: HybridSearcher
    answers: AnswerPipeline
    tracing: Tracing
    metrics: Metrics
    limiter: RateLimiter | SharedRateLimiter
    audit: AuditLog
    directory: DirectoryIdentity
    warmed: bool = False
    # The writer this process runs (`serve`), or its group's parent reports, if any.
    writer: WriterSupervisor | WriterReport | None = None
    shared: SharedDir | None = None  # the directory of this process's group, if in one
    previews: PreviewGate = field(default_factory=PreviewGate)
    mcp: McpDoor | None = None  # /mcp's server, running for the app's life

    @property
    def policy(self) -> LoadedPolicy:
        """The policy serving now; a request keeps the one that resolved its caller."""
        return self.policies.current
