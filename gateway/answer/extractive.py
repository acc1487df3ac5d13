"""The embedded extractive answerer: the few permitted sentences that best answer the query.

Each sentence of the assembled evidence is scored by cosine similarity to the query (the
packaged MiniLM model) plus a small bonus for sharing the query's content words. The answer
is the best sentence and any close runners-up, in reading order, each followed by its
citation number, at most `max_words` words. When even the best sentence is not relevant
enough, the answerer abstains instead of quoting something merely nearby.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.answer.context import Evidence
from gateway.embedding import Embedder
from gateway.ingest.chunk import split_sentences

_WORD = re.compile(r"[a-z0-9]+(?:[-_./][a-z0-9]+)*")
# Words too common to show that a sentence is about the question.
_STOP_WORDS = """
a an and are as at be but by did do does for from had has have how i if in into is
it its may me my no not of on or our should so than that the their them then there
these they this to was we were what when where which who whom whose why will with
would you your can could about after before over under up
"""
_STOP = frozenset(_STOP_WORDS.split())


@dataclass(frozen=True)
class AnswerOptions:
    max_sentences: int = 3
    max_words: int = 80
    max_blocks: int = 6  # only the best few blocks are read, to bound latency
    min_relevance: float = 0.45  # calibrated on SQuAD 2.0 dev; see README
    runner_up_margin: float = 0.12
    overlap_weight: float = 0.3


@dataclass(frozen=True)
class Answer:
    text: str
    cited: list[int]
    abstained: bool
    reason: str | None
    relevance: float  # best sentence score; in traces, never the text


@dataclass(frozen=True)
class _Sentence:
    n: int
    position: int
    text: str
    score: float


def content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def abstain(reason: str, relevance: float = 0.0) -> Answer:
    return Answer("", [], True, reason, relevance)


class ExtractiveAnswerer:
    def __init__(self, embedder: Embedder, options: AnswerOptions | None = None) -> None:
        self._embedder = embedder
        self.options = options or AnswerOptions()

    def answer(self, query: str, evidence: Sequence[Evidence]) -> Answer:
        if not evidence:
            return abstain("no_permitted_evidence")
        sentences = self._score(query, evidence[: self.options.max_blocks])
        if not sentences:
            return abstain("no_permitted_evidence")
        best = max(sentences, key=lambda s: s.score)
        if best.score < self.options.min_relevance:
            return abstain("insufficient_evidence", best.score)
        picked = self._pick(sentences, best)
        return Answer(
            text=" ".join(f"{s.text} [{s.n}]" for s in picked),
            cited=list(dict.fromkeys(s.n for s in picked)),
            abstained=False,
            reason=None,
            relevance=best.score,
        )

    def _score(self, query: str, evidence: Sequence[Evidence]) -> list[_Sentence]:
        units = [
            (e.n, i, text)
            for e in evidence
            for i, text in enumerate(split_sentences(e.hit.text))
            if _WORD.search(text.lower())
        ]
        if not units:
            return []
        query_vector = self._embedder.embed_query(query)
        vectors = self._embedder.embed([u[2] for u in units])
        cosine = vectors @ query_vector
        wanted = content_words(query)
        scores = []
        for (n, position, text), similarity in zip(units, cosine, strict=True):
            overlap = len(wanted & content_words(text)) / len(wanted) if wanted else 0.0
            score = float(similarity) + self.options.overlap_weight * overlap
            scores.append(_Sentence(n, position, text, score))
        return scores

    def _pick(self, sentences: list[_Sentence], best: _Sentence) -> list[_Sentence]:
        """The best sentence, then close runners-up while they fit, shown in reading order."""
        picked = [best]
        words = len(best.text.split())
        floor = best.score - self.options.runner_up_margin
        for candidate in sorted(sentences, key=lambda s: -s.score):
            if len(picked) >= self.options.max_sentences or candidate.score < floor:
                break
            size = len(candidate.text.split())
            if candidate is best or words + size > self.options.max_words:
                continue
            picked.append(candidate)
            words += size
        if words > self.options.max_words:  # a single over-long sentence is cut, not dropped
            cut = " ".join(best.text.split()[: self.options.max_words]) + " …"
            return [_Sentence(best.n, best.position, cut, best.score)]
        return sorted(picked, key=lambda s: (s.n, s.position))
