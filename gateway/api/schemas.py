"""Request and response bodies of the public HTTP contract."""

from __future__ import annotations

from datetime import date
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_QUERY_CHARS = 2000


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    top_k: int = Field(default=10, ge=1, le=100)
    group_by: Literal["chunk", "document"] = "chunk"


class LaneRanks(BaseModel):
    bm25: int | None = Field(description="1-based rank in the BM25 lane, null if absent")
    dense: int | None = Field(description="1-based rank in the dense lane, null if absent")
    exact: int | None = Field(
        default=None,
        description="1-based rank among chunks quoting an identifier of the query verbatim",
    )


class SearchResult(BaseModel):
    chunk_id: str
    doc_id: str
    version: str
    title: str
    uri: str
    score: float = Field(description="Fused (RRF) score; higher is better")
    text: str
    lanes: LaneRanks


class SearchResponse(BaseModel):
    results: list[SearchResult]
    degraded: list[str] = Field(description="Lanes that did not answer within their budget")
    trace_id: str
    policy_version: str
    index_generation: int


class AnswerRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    top_k: int = Field(default=10, ge=1, le=100, description="Fused candidates considered")
    stream: bool = Field(default=False, description="Server-sent events (not available yet)")


class Citation(BaseModel):
    n: int = Field(description="The number the answer text cites as [n]")
    chunk_id: str
    doc_id: str
    version: str
    title: str
    uri: str


class AnswerResponse(BaseModel):
    answer: str = Field(description="Empty when abstained")
    abstained: bool
    abstain_reason: str | None = Field(
        description="no_permitted_evidence | insufficient_evidence when abstained"
    )
    citations: list[Citation]
    degraded: list[str]
    trace_id: str
    policy_version: str
    index_generation: int
    timings_ms: dict[str, float] = Field(description="Milliseconds per stage")


class DocumentOut(BaseModel):
    doc_id: str
    version: str
    title: str
    uri: str
    tenant: str
    region: str
    effective_from: date
    effective_to: date | None
    text: str
    chunk_ids: list[str]


class ChunkOut(BaseModel):
    chunk_id: str
    doc_id: str
    version: str
    ordinal: int
    title: str
    uri: str
    text: str
    token_count: int


class Health(BaseModel):
    status: Literal["ok", "ready"]
    index_generation: int | None = None
    policy_version: str | None = None


class Problem(BaseModel):
    """application/problem+json (RFC 9457)."""

    type: str
    title: str
    status: int
    code: str
    detail: str | None = None
