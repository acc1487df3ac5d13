"""The answer path after search: rerank, expand, assemble under budget, answer or abstain.

`events` runs it as a stream: the evidence once assembled, then the answer's text as it is
produced, then the outcome, which is authoritative (its citations are checked; the text
streamed before it may have been superseded, e.g. by the extractive answer when the LLM
failed, or cut back to its whole sentences when the LLM stopped at its token bound).
`answer` runs the same and returns the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.answer.context import Evidence, assemble
from gateway.answer.extractive import Answer, AnswerOptions, ExtractiveAnswerer, abstain
from gateway.answer.llm import LlmAnswerer, LlmCut, LlmUnavailable, judge, whole_sentences
from gateway.answer.sanitise import StreamNeutraliser, neutralise
from gateway.answer.sentences import EvidenceSentence, evidence_sentences
from gateway.embedding import Embedder
from gateway.policy.model import Llm, Policy
from gateway.retrieval.expand import AsRetrieved, Expander, SectionNeighbours
from gateway.retrieval.rerank import KeepOrder, Reranker
from gateway.retrieval.scope import RequestScope
from gateway.retrieval.search import HybridSearcher
from gateway.storage.catalog import Catalog

EXTRACTIVE_TOKEN_WORDS = 4  # words per streamed piece of an extractive answer
# Characters read from the LLM per token it may write (`llm.answer_tokens`): a token is a
# few characters, so this is past any answer that kept its bound. A provider that ignores
# max_tokens is not read further: the link filter and the judge are quadratic in the
# worst text (18 s for 32,000 characters of "[a](").
CHARS_PER_TOKEN = 8
# How long past `budgets.llm_ms` a caller reading slowly may keep the LLM's stream open.
READ_GRACE_S = 30.0


@dataclass(frozen=True)
class AnswerOutcome:
    answer: Answer
    evidence: list[Evidence]
    degraded: list[str]
    generation: int

    @property
    def citations(self) -> list[tuple[int, Evidence]]:
        """(number shown in the answer, evidence block) for every block the answer cites."""
        by_n = {e.n: e for e in self.evidence}
        return [(k, by_n[n]) for k, n in enumerate(self.answer.cited, start=1)]


@dataclass(frozen=True)
class EvidenceEvent:
    evidence: list[Evidence]


@dataclass(frozen=True)
class TokenEvent:
    text: str


AnswerEvent = EvidenceEvent | TokenEvent | AnswerOutcome


@dataclass(frozen=True)
class LlmOptions:
    """What a caller may ask of the LLM (OpenAI's `max_tokens`, `temperature`); within the
    policy's bounds, and ignored by the extractive answerer."""

    max_tokens: int | None = None
    temperature: float | None = None


@dataclass
class _Request:
    scope: RequestScope
    degraded: list[str] = field(default_factory=list)
    options: LlmOptions | None = None

    @property
    def policy(self) -> Policy:
        return self.scope.policy


class AnswerPipeline:
    def __init__(
        self,
        searcher: HybridSearcher,
        embedder: Embedder,
        catalog: Catalog,
        reranker: Reranker | None = None,
        llm: LlmAnswerer | None = None,
    ) -> None:
        self._searcher = searcher
        self._embedder = embedder
        self._catalog = catalog
        self._reranker = reranker or KeepOrder()
        self.llm = llm

    async def answer(self, scope: RequestScope, options: LlmOptions | None = None) -> AnswerOutcome:
        # Closed before returning: left for the event loop to finalise later, the events
        # held their LLM slot past the response, and the caller's next request could be
        # refused `llm_busy`.
        async with contextlib.aclosing(self.events(scope, options)) as events:
            async for event in events:
                if isinstance(event, AnswerOutcome):
                    return event
        raise AssertionError("the answer stream always ends with its outcome")

    async def events(
        self, scope: RequestScope, options: LlmOptions | None = None
    ) -> AsyncGenerator[AnswerEvent]:
        """The answer's events; with an LLM, the answer holds one of its slots throughout
        (none free: 503 `llm_busy` before anything is retrieved or sent)."""
        limit = scope.policy.llm.max_concurrent
        with self.llm.slot(limit) if self.llm is not None else contextlib.nullcontext():
            async for event in self._events(scope, options):
                yield event

    async def _events(
        self, scope: RequestScope, options: LlmOptions | None
    ) -> AsyncIterator[AnswerEvent]:
        found = await self._searcher.search(scope)
        request = _Request(scope, list(found.degraded), options)
        policy, query, clock = scope.policy, scope.query, scope.clock
        reordered = policy.retrieval.rerank_candidates
        with clock.stage(
            "rerank",
            reranker=self._reranker.name,
            candidates=len(found.hits),
            rerank_candidates=reordered,
        ):
            hits = await asyncio.to_thread(self._reranker.rerank, query, found.hits, reordered)
        expander = self._expander(policy)
        with clock.stage("expand", expander=expander.name, candidates=len(hits)) as info:
            tenant = scope.caller.tenant
            hits = await asyncio.to_thread(expander.expand, hits, tenant, found.generation)
            info.update(blocks=len(hits))
        budget = policy.answering.context_tokens
        with clock.stage("assemble", budget_tokens=budget) as info:
            assembly = await asyncio.to_thread(assemble, hits, budget, self._embedder.count_tokens)
            info.update(
                blocks=len(assembly.evidence),
                tokens=assembly.tokens,
                dropped_duplicates=assembly.dropped_duplicates,
                dropped_budget=assembly.dropped_budget,
                chunk_ids=[e.hit.chunk_id for e in assembly.evidence],
            )
        evidence = assembly.evidence
        yield EvidenceEvent(evidence)
        answer: Answer | None = None
        with clock.stage("answer") as info:
            if self.llm is not None and evidence:
                async for event in self._llm_answer(self.llm, request, evidence, info):
                    if isinstance(event, TokenEvent):
                        yield event
                    else:
                        answer = event
            if answer is None:
                answer = await asyncio.to_thread(self._extract, request, evidence, info)
                for piece in _pieces(answer.text):
                    yield TokenEvent(piece)
        yield AnswerOutcome(answer, evidence, request.degraded, found.generation)

    async def _llm_answer(
        self, llm: LlmAnswerer, request: _Request, evidence: list[Evidence], info: dict[str, Any]
    ) -> AsyncIterator[TokenEvent | Answer]:
        """The LLM's answer, streamed then judged; nothing (and `llm` degraded) when the
        endpoint fails or runs past `budgets.llm_ms`, so the extractive answer serves. An
        answer stopped at its token bound is judged on its whole sentences up to its last
        cited one; with none, the extractive answer serves (`llm` degraded)."""
        settings = request.policy.llm
        model = llm.model_for(request.scope.caller.tenant, settings)
        info.update(answerer="llm", model=model)
        prompt = llm.prompt(request.scope.query, evidence, settings)
        if prompt is None:
            info.update(abstained=True, reason="budget_exceeded")
            yield abstain("budget_exceeded")
            return
        info.update(llm_blocks=len(prompt.blocks), prompt_tokens=prompt.tokens)
        settings = _asked(settings, request.options)
        # Links whose target is not an evidence document's own uri lose it, as streamed.
        own_uris = {e.hit.uri for e in evidence if e.hit.uri}
        links = StreamNeutraliser(own_uris)
        parts: list[str] = []
        room = settings.answer_tokens * CHARS_PER_TOKEN
        # `llm_ms` bounds waiting for the LLM, not the time the caller takes to read what
        # was yielded: a timeout around the yields too ended a slow reader's stream in
        # the middle of Starlette's send, with neither `final` nor `error`.
        # The caller's reading is bounded too, more loosely: the LLM's connection and its
        # slot (`llm.max_concurrent`) are held while the stream is open.
        loop = asyncio.get_running_loop()
        budget = request.policy.budgets.llm_ms / 1000  # of waiting for the LLM, left
        held_until = loop.time() + budget + READ_GRACE_S
        cut = ""  # why the answer stopped short, if it did
        try:
            async with contextlib.aclosing(llm.stream(prompt, model, settings)) as streamed:
                while room > 0:
                    if loop.time() > held_until:
                        raise TimeoutError
                    waited_from = loop.time()
                    async with asyncio.timeout(budget):
                        part = await anext(streamed, None)
                    budget -= loop.time() - waited_from
                    if part is None:
                        break
                    part = part[:room]
                    room -= len(part)
                    parts.append(part)
                    if settled := links.feed(part):
                        yield TokenEvent(settled)
                if room <= 0:
                    cut = "past answer_tokens"
        except LlmCut:
            cut = "finish_reason length"
        except (TimeoutError, LlmUnavailable) as exc:
            request.degraded.append("llm")
            info.update(llm_failed="timeout" if isinstance(exc, TimeoutError) else "error")
            return
        if rest := links.finish():
            yield TokenEvent(rest)
        text = neutralise("".join(parts), own_uris)
        if cut:  # streamed to the end of the cut; the outcome has only whole sentences
            info.update(llm_cut=cut)
            text = whole_sentences(text, {b.n for b in prompt.blocks})
            if not text:
                request.degraded.append("llm")
                info.update(llm_failed="cut")
                return
        judged = judge(text, prompt)
        if cut and not judged.answer.abstained:
            judged = replace(judged, answer=replace(judged.answer, truncated=True))
        info.update(
            abstained=judged.answer.abstained,
            reason=judged.answer.reason,
            cited=judged.answer.cited,
            dropped_citations=judged.dropped_citations,
            words=len(judged.answer.text.split()),
        )
        yield judged.answer

    def _extract(
        self, request: _Request, evidence: Sequence[Evidence], info: dict[str, Any]
    ) -> Answer:
        answerer = ExtractiveAnswerer(_options(request.policy))
        # The best few retrieved chunks are read, each with the context expanded beside it.
        groups = list(dict.fromkeys(e.group for e in evidence))[: answerer.options.max_blocks]
        blocks = [e for e in evidence if e.group in groups]
        generation, tenant = request.scope.index.number, request.scope.caller.tenant

        def stored_vectors(chunk_ids: Sequence[str]) -> dict[str, bytes | None]:
            # As the request's generation holds them: a chunk changed since is embedded now.
            rows = self._catalog.chunk_rows(tenant, chunk_ids, as_of_generation=generation)
            return {c: row.sentence_vectors for c, row in rows.items()}

        sentences, embedded_now = evidence_sentences(blocks, stored_vectors, self._embedder)
        # Links are neutralised as in the LLM's answer: a client rendering a quoted
        # `![](https://tracker/...)` would load it. Before picking: the word limit holds.
        sentences = _linkless(sentences, {e.hit.uri for e in evidence if e.hit.uri})
        query = request.scope.query
        query_vector = self._embedder.embed_query(query, scope=request.scope.caller.cache_scope)
        answer = answerer.answer(query, query_vector, sentences)
        info.update(
            answerer="extractive" if "answerer" not in info else "llm_then_extractive",
            blocks=len(blocks),
            sentences=len(sentences),
            embedded_now=embedded_now,
            abstained=answer.abstained,
            reason=answer.reason,
            relevance=round(answer.relevance, 4),
            cited=answer.cited,
            words=len(answer.text.split()),
        )
        return answer

    def _expander(self, policy: Policy) -> Expander:
        window = policy.answering.expand_neighbours
        return SectionNeighbours(self._catalog, window) if window > 0 else AsRetrieved()


def _linkless(sentences: list[EvidenceSentence], allowed: set[str]) -> list[EvidenceSentence]:
    """The sentences with links neutralised (`neutralise`); one left empty (an image
    without alt text) is no sentence."""
    out = []
    for sentence in sentences:
        text = " ".join(neutralise(sentence.text, allowed).split())
        if text:
            out.append(sentence if text == sentence.text else replace(sentence, text=text))
    return out


def _asked(settings: Llm, options: LlmOptions | None) -> Llm:
    """The caller's sampling wishes: fewer answer tokens than the policy's, never more (the
    prompt was cut to leave that many), and its temperature."""
    if options is None:
        return settings
    update: dict[str, Any] = {}
    if options.max_tokens is not None:
        update["answer_tokens"] = min(options.max_tokens, settings.answer_tokens)
    if options.temperature is not None:
        update["temperature"] = options.temperature
    return settings.model_copy(update=update)


def _pieces(text: str) -> list[str]:
    """An extractive answer streamed a few words at a time, spaces kept."""
    if not text:
        return []
    words, step = text.split(" "), EXTRACTIVE_TOKEN_WORDS
    return [
        " ".join(words[i : i + step]) + (" " if i + step < len(words) else "")
        for i in range(0, len(words), step)
    ]


def _options(policy: Policy) -> AnswerOptions:
    a = policy.answering
    return AnswerOptions(
        max_sentences=a.max_sentences, max_words=a.max_words, min_relevance=a.min_relevance
    )
