"""The pipelines every door calls: /search and /answer, the MCP tools, /v1/chat/completions.

One function per operation, so that a door differs from another only in how it reads its
input and writes its output: what is searched, for whom, what is recorded in the audit
trail and the trace, is the same code whichever door a caller came through.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from gateway.answer.context import Evidence
from gateway.answer.pipeline import AnswerEvent, AnswerOutcome, LlmOptions
from gateway.api.schemas import AnswerResponse, Citation, SearchResponse
from gateway.api.state import AppState
from gateway.domain import Caller
from gateway.policy.loader import LoadedPolicy
from gateway.retrieval.results import GroupBy
from gateway.retrieval.scope import RequestScope
from gateway.storage.layout import ServedIndex
from gateway.telemetry.audit import note, note_ids
from gateway.telemetry.stages import StageClock
from gateway.telemetry.tracing import Span, Tracing


@dataclass(frozen=True)
class Asker:
    """Who asks, under which policy, timed by which clock: what every pipeline needs."""

    state: AppState
    policy: LoadedPolicy
    caller: Caller
    clock: StageClock


def request_attributes(caller: Caller, policy: LoadedPolicy) -> dict[str, object]:
    """Who asked under which policy: the subject ID and scope, never the token or claims."""
    return {
        "gateway.subject": caller.subject,
        "gateway.caller_kind": caller.kind,
        "gateway.tenant": caller.tenant,
        "gateway.region": caller.region,
        "gateway.policy_version": policy.version,
    }


@asynccontextmanager
async def retrieval_span(
    name: str, asker: Asker, top_k: int
) -> AsyncIterator[tuple[Span, ServedIndex]]:
    """The request span of a call that retrieves, and the generation both lanes will read."""
    state, clock = asker.state, asker.clock
    attributes = {**request_attributes(asker.caller, asker.policy), "gateway.top_k": top_k}
    try:
        with state.tracing.request(name, clock, **attributes) as span:
            index = await state.indexes.current()
            Tracing.set(span, **{"gateway.index_generation": index.number})
            note(index_generation=index.number)
            yield span, index
    finally:
        state.metrics.observe_stages(clock)


async def run_search(
    asker: Asker, query: str, top_k: int, group_by: GroupBy = "chunk", span_name: str = "search"
) -> SearchResponse:
    state, policy, clock = asker.state, asker.policy, asker.clock
    async with retrieval_span(span_name, asker, top_k) as (span, index):
        scope = RequestScope(index, policy.policy, asker.caller, query, top_k, clock)
        outcome = await state.searcher.search(scope, group_by)
        Tracing.set(
            span, **{"gateway.results": len(outcome.hits), "gateway.degraded": outcome.degraded}
        )
        state.metrics.observe_degraded(outcome.degraded)
        trace_id = Tracing.trace_id(span)
    note(degraded=list(outcome.degraded))
    note_ids((h.doc_id for h in outcome.hits), (h.chunk_id for h in outcome.hits))
    # Plain dicts validated once as a whole: half the cost of a model per result.
    results = [
        {
            "chunk_id": h.chunk_id,
            "doc_id": h.doc_id,
            "version": h.version,
            "title": h.title,
            "uri": h.uri,
            "score": h.score,
            "text": h.text,
            "lanes": h.lanes,
        }
        for h in outcome.hits
    ]
    return SearchResponse.model_validate(
        {
            "results": results,
            "degraded": outcome.degraded,
            "trace_id": trace_id,
            "policy_version": policy.version,
            "index_generation": outcome.generation,
            "timings_ms": clock.timings_ms(),
        }
    )


async def run_answer(
    asker: Asker,
    query: str,
    top_k: int,
    span_name: str = "answer",
    llm: LlmOptions | None = None,
) -> AnswerResponse:
    state, policy, clock = asker.state, asker.policy, asker.clock
    async with retrieval_span(span_name, asker, top_k) as (span, index):
        scope = RequestScope(index, policy.policy, asker.caller, query, top_k, clock)
        outcome = await state.answers.answer(scope, llm)
        Tracing.set(span, **answer_attributes(outcome))
        state.metrics.observe_degraded(outcome.degraded)
        trace_id = Tracing.trace_id(span)
    return answer_body(outcome, trace_id, policy, clock)


@dataclass
class AnswerStream:
    """An answer whose first event has come: the rest, and the span to close at its end."""

    first: AnswerEvent
    events: AsyncGenerator[AnswerEvent]
    span: Span
    stack: AsyncExitStack

    # The events are closed first: a door stops reading them at the outcome, and left for
    # the event loop to finalise later they held their LLM slot past the response
    # (`llm_busy` for the caller's next request).
    async def fail(self) -> None:
        failure = sys.exc_info()
        try:
            await self.events.aclose()
        finally:
            await self.stack.__aexit__(*failure)

    async def close(self) -> None:
        try:
            await self.events.aclose()
        finally:
            await self.stack.aclose()


async def start_answer(
    asker: Asker, query: str, top_k: int, span_name: str = "answer", llm: LlmOptions | None = None
) -> AnswerStream:
    """Retrieval runs before a streamed response starts, so its failures (503, ...) keep
    their status; the request span stays open until the stream's last event."""
    stack = AsyncExitStack()
    span, index = await stack.enter_async_context(retrieval_span(span_name, asker, top_k))
    scope = RequestScope(index, asker.policy.policy, asker.caller, query, top_k, asker.clock)
    events = asker.state.answers.events(scope, llm)
    try:
        first = await anext(events)
    except BaseException:
        await stack.__aexit__(*sys.exc_info())
        raise
    return AnswerStream(first, events, span, stack)


def finish_answer(stream: AnswerStream, asker: Asker, outcome: AnswerOutcome) -> AnswerResponse:
    """The streamed answer's final body, recorded and traced like a plain one."""
    Tracing.set(stream.span, **answer_attributes(outcome))
    asker.state.metrics.observe_degraded(outcome.degraded)
    return answer_body(outcome, Tracing.trace_id(stream.span), asker.policy, asker.clock)


def citation(n: int, e: Evidence) -> Citation:
    """Block `e` shown as [n]: in the evidence event n is its own number, in the answer
    the number the answer cites it by."""
    h = e.hit
    return Citation(
        n=n, chunk_id=h.chunk_id, doc_id=h.doc_id, version=h.version, title=h.title, uri=h.uri
    )


def answer_body(
    outcome: AnswerOutcome, trace_id: str, policy: LoadedPolicy, clock: StageClock
) -> AnswerResponse:
    """The answer's body (streamed or not), once per answer."""
    cited = [e.hit for _, e in outcome.citations]
    note_ids((h.doc_id for h in cited), (h.chunk_id for h in cited))
    note(degraded=list(outcome.degraded), abstain_reason=outcome.answer.reason)
    return AnswerResponse(
        answer=outcome.answer.text,
        abstained=outcome.answer.abstained,
        abstain_reason=outcome.answer.reason,
        citations=[citation(n, e) for n, e in outcome.citations],
        degraded=outcome.degraded,
        truncated=outcome.answer.truncated,
        trace_id=trace_id,
        policy_version=policy.version,
        index_generation=outcome.generation,
        timings_ms=clock.timings_ms(),
    )


def answer_attributes(outcome: AnswerOutcome) -> dict[str, object]:
    return {
        "gateway.abstained": outcome.answer.abstained,
        "gateway.abstain_reason": outcome.answer.reason,
        "gateway.citations": [e.hit.chunk_id for _n, e in outcome.citations],
        "gateway.degraded": outcome.degraded,
    }
