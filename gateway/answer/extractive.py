"""The embedded extractive answerer: the few permitted sentences that best answer the query.

Each sentence of the evidence is scored by cosine similarity to the query (the packaged
MiniLM model) plus a bonus for sharing the query's content words. The answer is the best
sentence and any close runners-up, in reading order, each followed by its citation number,
at most `max_sentences` sentences and `max_words` words. A picked sentence that leans on
the one before it ("It was built in 1712.") brings that sentence along when both limits
allow, ahead of weaker runners-up, so the answer reads on its own. A Markdown heading is
neither quoted nor brought along: it names a topic, it does not answer anything. When even
the best sentence is not relevant enough, the answerer abstains instead of quoting something
merely nearby.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gateway.answer.citations import escape_quoted
from gateway.answer.sentences import EvidenceSentence

_WORD = re.compile(r"[a-z0-9]+(?:[-_./][a-z0-9]+)*")
# Words too common to show that a sentence is about the question.
_STOP_WORDS = """
a an and are as at be but by did do does for from had has have how i if in into is
it its may me my no not of on or our should so than that the their them then there
these they this to was we were what when where which who whom whose why will with
would you your can could about after before over under up
"""
_STOP = frozenset(_STOP_WORDS.split())
# First words by which a sentence points back at the one before it.
_LEANS_BACK_WORDS = """
it its this these those that they their them he his him she her such however thus
therefore instead also later afterwards meanwhile
"""
_LEANS_BACK = frozenset(_LEANS_BACK_WORDS.split())


@dataclass(frozen=True)
class AnswerOptions:
    max_sentences: int = 3
    max_words: int = 80
    max_blocks: int = 6  # only the best few blocks are read, to bound latency
    # Calibrated together on the SQuAD 2.0 dev slice by scripts/calibrate_abstention.py
    # (docs/evaluation.md, "Answers and abstention").
    min_relevance: float = 0.575
    runner_up_margin: float = 0.15
    overlap_weight: float = 0.5


@dataclass(frozen=True)
class Answer:
    text: str
    # Evidence numbers in citation order: the answer's "[k]" cites evidence block cited[k-1],
    # so the reader sees [1], [2], ... however deep in the evidence the sentences were.
    cited: list[int]
    abstained: bool
    reason: str | None
    relevance: float  # best sentence score; in traces, never the text
    # The LLM's answer stopped at its token bound and was kept to its whole sentences.
    truncated: bool = False


@dataclass(frozen=True)
class _Scored:
    sentence: EvidenceSentence
    score: float


def content_words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def abstain(reason: str, relevance: float = 0.0) -> Answer:
    return Answer("", [], True, reason, relevance)


class ExtractiveAnswerer:
    def __init__(self, options: AnswerOptions | None = None) -> None:
        self.options = options or AnswerOptions()

    def answer(
        self, query: str, query_vector: np.ndarray, sentences: Sequence[EvidenceSentence]
    ) -> Answer:
        if not sentences:
            return abstain("no_permitted_evidence")
        quotable = [s for s in sentences if not s.heading]
        if not quotable:
            return abstain("insufficient_evidence")
        scored = self._score(query, query_vector, quotable)
        best = max(scored, key=lambda s: s.score)
        if best.score < self.options.min_relevance:
            return abstain("insufficient_evidence", best.score)
        picked = self._pick(scored, best)
        cited = list(dict.fromkeys(s.n for s in picked))
        number = {n: k for k, n in enumerate(cited, start=1)}
        return Answer(
            # The document's own "[2]" is quoted escaped, so it reads as no citation of ours.
            text=" ".join(f"{escape_quoted(s.text)} [{number[s.n]}]" for s in picked),
            cited=cited,
            abstained=False,
            reason=None,
            relevance=best.score,
        )

    def _score(
        self, query: str, query_vector: np.ndarray, sentences: Sequence[EvidenceSentence]
    ) -> list[_Scored]:
        cosine = np.stack([s.vector for s in sentences]) @ query_vector
        wanted = content_words(query)
        scored = []
        for sentence, similarity in zip(sentences, cosine, strict=True):
            shared = len(wanted & content_words(sentence.text)) / len(wanted) if wanted else 0.0
            scored.append(
                _Scored(sentence, float(similarity) + self.options.overlap_weight * shared)
            )
        return scored

    def _pick(self, scored: list[_Scored], best: _Scored) -> list[EvidenceSentence]:
        """The best sentence, then close runners-up while they fit, shown in reading order.
        Each brings the sentence before it when it leans back on that one and both fit.

        The limits count what a reader sees: an antecedent is one of the `max_sentences`,
        and the word limit includes citation markers. A sentence is shown once, under the
        block it was first picked from: overlapping chunks repeat the sentences at their
        seam, and copies of a text say the same thing again."""
        limit = self.options.max_words
        by_place = {(s.sentence.n, s.sentence.position): s.sentence for s in scored}
        picked: list[EvidenceSentence] = []
        shown: set[str] = set()  # the picked sentences' texts, as `_same_text` compares them
        words = 0
        floor = best.score - self.options.runner_up_margin

        def fits(group: list[EvidenceSentence]) -> bool:
            return (
                len(picked) + len(group) <= self.options.max_sentences
                and words + sum(map(_shown_words, group)) <= limit
            )

        runners_up = sorted((s for s in scored if s is not best), key=lambda s: -s.score)
        for candidate in [best, *runners_up]:
            if len(picked) >= self.options.max_sentences or candidate.score < floor:
                break
            sentence = candidate.sentence
            if _same_text(sentence) in shown:
                continue  # already shown: picked, or the antecedent of a better sentence
            group = [sentence]
            before = by_place.get((sentence.n, sentence.position - 1))
            if _leans_back(sentence.text) and before and _same_text(before) not in shown:
                group = [before, sentence]
            fitting = [g for g in (group, [sentence]) if fits(g)]
            if not fitting and candidate is not best:
                continue
            chosen = fitting[0] if fitting else [sentence]  # the best is shown, cut if too long
            picked += chosen
            shown.update(map(_same_text, chosen))
            words += sum(map(_shown_words, chosen))
        if words > limit:  # a single over-long sentence is cut, not dropped
            top = best.sentence
            cut = " ".join(top.text.split()[: limit - 2]) + " …"  # room for "…" and "[n]"
            return [EvidenceSentence(top.n, top.position, cut, top.vector)]
        return sorted(picked, key=lambda s: (s.n, s.position))


def _leans_back(text: str) -> bool:
    first = _WORD.match(text.lower())
    return first is not None and first.group() in _LEANS_BACK


def _same_text(sentence: EvidenceSentence) -> str:
    """The text as a reader compares it: spacing and case do not make another sentence."""
    return " ".join(sentence.text.split()).casefold()


def _shown_words(sentence: EvidenceSentence) -> int:
    return len(sentence.text.split()) + 1  # the sentence and its "[n]"
