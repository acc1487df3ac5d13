"""The MCP tools `search`, `fetch` and `answer`: the gateway's pipelines as an agent sees them.

Each tool runs as the caller that /mcp authenticated (gateway.api.mcp puts it on the HTTP
request the SDK hands the tool), through the same functions as /search, /documents,
/chunks and /answer (gateway.api.calls), so a tool returns exactly what the route it
mirrors returns to that caller. Descriptions are written for a model choosing a tool.

The official `mcp` SDK is imported here and in gateway.api.mcp only.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field
from starlette.requests import Request

from gateway import __version__
from gateway.api.calls import Asker, run_answer, run_search
from gateway.api.identifiers import names_nothing
from gateway.api.mcp import RECORDED_STATUS
from gateway.api.schemas import MAX_QUERY_CHARS, Citation
from gateway.api.security import clock_of, state_of
from gateway.errors import GatewayError
from gateway.retrieval.lookup import visible_chunk, visible_document
from gateway.retrieval.search import today_utc
from gateway.telemetry.audit import bound, note_ids
from gateway.uris import shown_uri

# Hidden and missing alike, and never the ID asked for (the SDK logs tool errors).
NOT_VISIBLE = "not found: no document or chunk with this ID is visible to you"
READ_ONLY = ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
INSTRUCTIONS = (
    "Search, read and get cited answers from the organisation's documents, restricted to "
    "what the signed-in user may read. Use `search` to find passages, `fetch` to read one "
    "in full, `answer` for a short answer citing its sources as [n]."
)


class SearchHit(BaseModel):
    id: str = Field(description="The passage's chunk ID: pass it to `fetch`")
    doc_id: str = Field(description="The document's ID: `fetch` it for the whole document")
    version: str
    title: str
    url: str = Field(description="Where the document lives (a link to cite)")
    text: str = Field(description="The passage")
    score: float = Field(description="Higher is more relevant")


class SearchResults(BaseModel):
    results: list[SearchHit] = Field(description="Best first")


class FetchMetadata(BaseModel):
    doc_id: str
    version: str
    chunk_id: str | None = Field(default=None, description="When a passage was fetched")
    ordinal: int | None = Field(default=None, description="The passage's place in the document")
    effective_from: str | None = None
    effective_to: str | None = None


class Fetched(BaseModel):
    id: str
    title: str
    text: str
    url: str
    metadata: FetchMetadata


class Answered(BaseModel):
    answer: str = Field(description="The answer with [n] markers; empty when abstained")
    abstained: bool
    abstain_reason: str | None
    citations: list[Citation] = Field(description="What each [n] cites")


Query = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_QUERY_CHARS,
        description="What to look for, in words (a question, keywords or an ID such as RPL-14)",
    ),
]
Question = Annotated[
    str,
    Field(min_length=1, max_length=MAX_QUERY_CHARS, description="The question, in words"),
]
TopK = Annotated[int, Field(ge=1, le=50, description="How many passages (1-50)")]
Id = Annotated[
    str,
    Field(min_length=1, max_length=512, description="A result's `id` (chunk) or `doc_id`"),
]
Ctx = Context[Any, Any]


def _asker(ctx: Ctx) -> tuple[Asker, Request]:
    request = ctx.request_context.request
    if not isinstance(request, Request):  # never over HTTP: /mcp is its only door
        raise ToolError("this server answers over HTTP only")
    state = state_of(request)
    return Asker(state, request.state.policy, request.state.caller, clock_of(request)), request


class NotVisible(ToolError):
    """Hidden and missing alike: what /documents and /chunks answer 404."""

    def __init__(self) -> None:
        super().__init__(NOT_VISIBLE)


@contextmanager
def _tool(request: Request, name: str) -> Iterator[None]:
    """Times and counts the call by tool, records it in the request's audit record, with
    the status the route it mirrors would have answered (the client gets a 200 either
    way), and turns the gateway's errors into tool errors the model can read."""
    metrics = state_of(request).metrics
    started, outcome, status = time.perf_counter(), "ok", 200
    try:
        with bound(getattr(request.state, "audit_facts", None)):
            yield
    except GatewayError as exc:
        outcome, status = "tool_error", exc.status
        raise ToolError(f"{exc.code}: {exc.detail or exc.title}") from None
    except NotVisible:
        outcome, status = "tool_error", 404
        raise
    except Exception:  # a fault the SDK turns into a tool error (without its text)
        outcome, status = "tool_error", 500
        raise
    finally:
        request.scope[RECORDED_STATUS] = status
        metrics.mcp_tool_calls.labels(name, outcome).inc()
        metrics.mcp_tool_duration.labels(name).observe(time.perf_counter() - started)


async def search(query: Query, ctx: Ctx, top_k: TopK = 10) -> SearchResults:
    asker, request = _asker(ctx)
    with _tool(request, "search"):
        found = await run_search(asker, query, top_k, span_name="mcp.search")
    return SearchResults(
        results=[
            SearchHit(
                id=r.chunk_id,
                doc_id=r.doc_id,
                version=r.version,
                title=r.title,
                url=r.uri,
                text=r.text,
                score=r.score,
            )
            for r in found.results
        ]
    )


async def fetch(id: Id, ctx: Ctx) -> Fetched:
    asker, request = _asker(ctx)
    state, caller = asker.state, asker.caller
    with _tool(request, "fetch"):
        if names_nothing(id):  # a NUL, a lone surrogate: as /documents and /chunks, before
            raise NotVisible()  # a database fails on it (PostgreSQL refuses a NUL)
        today = today_utc()
        found = visible_chunk(state.catalog, caller, id, today)
        if found is not None:
            chunk, document = found
            note_ids([chunk.doc_id], [chunk.chunk_id])
            return Fetched(
                id=chunk.chunk_id,
                title=document.title,
                text=chunk.text,
                url=shown_uri(document.uri),
                metadata=_metadata(document, chunk.chunk_id, chunk.ordinal),
            )
        row = visible_document(state.catalog, caller, id, today)
        if row is None:
            raise NotVisible()
        note_ids([row.doc_id], [])
        return Fetched(
            id=row.doc_id,
            title=row.title,
            text=row.text,
            url=shown_uri(row.uri),
            metadata=_metadata(row),
        )


def _metadata(row: Any, chunk_id: str | None = None, ordinal: int | None = None) -> FetchMetadata:
    return FetchMetadata(
        doc_id=row.doc_id,
        version=row.version,
        chunk_id=chunk_id,
        ordinal=ordinal,
        effective_from=row.effective_from.isoformat(),
        effective_to=row.effective_to.isoformat() if row.effective_to else None,
    )


async def answer(query: Question, ctx: Ctx) -> Answered:
    asker, request = _asker(ctx)
    with _tool(request, "answer"):
        answered = await run_answer(asker, query, 10, span_name="mcp.answer")
    return Answered(
        answer=answered.answer,
        abstained=answered.abstained,
        abstain_reason=answered.abstain_reason,
        citations=answered.citations,
    )


DESCRIPTIONS: dict[str, tuple[str, Callable[..., Awaitable[BaseModel]]]] = {
    "search": (
        "Search the organisation's documents for passages relevant to a query. Results are "
        "already restricted to what the signed-in user may read. Returns passages best first, "
        "each with its `id` (a chunk ID), `doc_id`, title, `url` and text. Call `fetch` with "
        "an `id` for the whole passage or a `doc_id` for the whole document.",
        search,
    ),
    "fetch": (
        "Fetch the full text of one search result by its `id` (a passage) or its `doc_id` (a "
        "whole document), with its title, url and metadata. An ID the user may not read gives "
        "the same 'not found' error as one that does not exist.",
        fetch,
    ),
    "answer": (
        "Answer a question from the documents the signed-in user may read: a few sentences "
        "citing their sources as [n], with the citations listed. It abstains (abstained=true, "
        "with a reason) rather than guess when the documents do not answer it.",
        answer,
    ),
}
TITLES = {
    "search": "Search documents",
    "fetch": "Fetch a document or passage",
    "answer": "Answer with citations",
}


def add_tools(server: MCPServer[Any]) -> None:
    for name, (description, function) in DESCRIPTIONS.items():
        server.add_tool(
            function,
            name=name,
            title=TITLES[name],
            description=description,
            annotations=READ_ONLY,
            structured_output=True,
        )


def new_server() -> MCPServer[Any]:
    return MCPServer(
        name="rag-gateway",
        title="Permission-aware RAG gateway",
        instructions=INSTRUCTIONS,
        version=__version__,
        log_level="WARNING",
        # No `subscriptions/listen`: it holds a server stream open (a ping every 15 s) that
        # spends no request and leaves no record; /mcp answers every call in its response.
        subscriptions=False,
    )
