"""The answer path after search: rerank, expand, assemble under budget, answer or abstain."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.answer.context import Evidence, assemble
from gateway.answer.extractive import Answer, AnswerOptions, ExtractiveAnswerer
from gateway.answer.sentences import evidence_sentences
from gateway.domain import Caller
from gateway.embedding import Embedder
from gateway.policy.model import Policy
from gateway.retrieval.expand import AsRetrieved, Expander, SectionNeighbours
from gateway.retrieval.rerank import KeepOrder, Reranker
from gateway.retrieval.search import HybridSearcher
from gateway.storage.catalog import Catalog
from gateway.storage.generations import ServedIndex
from gateway.telemetry.stages import StageClock


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


class AnswerPipeline:
    def __init__(
        self,
        searcher: HybridSearcher,
        embedder: Embedder,
        catalog: Catalog,
        reranker: Reranker | None = None,
    ) -> None:
        self._searcher = searcher
        self._embedder = embedder
        self._catalog = catalog
        self._reranker = reranker or KeepOrder()

    async def answer(
        self,
        index: ServedIndex,
        policy: Policy,
        caller: Caller,
        query: str,
        top_k: int,
        clock: StageClock,
        as_of: dt.date | None = None,
    ) -> AnswerOutcome:
        found = await self._searcher.search(index, policy, caller, query, top_k, clock, as_of=as_of)
        with clock.stage("rerank", reranker=self._reranker.name, candidates=len(found.hits)):
            hits = await asyncio.to_thread(self._reranker.rerank, query, found.hits)
        expander = self._expander(policy)
        with clock.stage("expand", expander=expander.name, candidates=len(hits)) as info:
            hits = await asyncio.to_thread(expander.expand, hits)
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
        answerer = ExtractiveAnswerer(_options(policy))
        with clock.stage("answer", answerer="extractive") as info:
            answer = await asyncio.to_thread(
                self._answer, answerer, query, caller.tenant, assembly.evidence, info
            )
        return AnswerOutcome(answer, assembly.evidence, found.degraded, found.generation)

    def _answer(
        self,
        answerer: ExtractiveAnswerer,
        query: str,
        tenant: str,
        evidence: Sequence[Evidence],
        info: dict[str, Any],
    ) -> Answer:
        # The best few retrieved chunks are read, each with the context expanded beside it.
        groups = list(dict.fromkeys(e.group for e in evidence))[: answerer.options.max_blocks]
        blocks = [e for e in evidence if e.group in groups]
        sentences, embedded_now = evidence_sentences(blocks, self._stored_vectors, self._embedder)
        query_vector = self._embedder.embed_query(query, scope=tenant)
        answer = answerer.answer(query, query_vector, sentences)
        info.update(
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

    def _stored_vectors(self, chunk_ids: Sequence[str]) -> dict[str, bytes | None]:
        return {c: row.sentence_vectors for c, row in self._catalog.chunk_rows(chunk_ids).items()}


def _options(policy: Policy) -> AnswerOptions:
    a = policy.answering
    return AnswerOptions(
        max_sentences=a.max_sentences, max_words=a.max_words, min_relevance=a.min_relevance
    )
