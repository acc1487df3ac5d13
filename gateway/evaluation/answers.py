"""`gateway eval --answers`: the answer path scored on SQuAD-style questions.

Questions (JSONL): `id`, `question`, `answers` (gold strings, or SQuAD's answer objects),
`is_impossible` (true or false), and `gold_passage_id`, the corpus `_id` of the paragraph
the question was written against. Each question falls in one class:

- answerable: its paragraph is in the corpus and holds an answer; scored by how often the
  answer cites that paragraph, contains a gold answer, and by SQuAD F1 (the official
  normalisation: lower case, no punctuation, articles or extra spaces; the best gold);
- unanswerable: its paragraph is in the corpus but holds no answer; should abstain;
- off-corpus: its paragraph is not in the corpus; should abstain.

Every question runs through the same restricted pipeline as `POST /answer`.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import string
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gateway.answer.extractive import Answer
from gateway.answer.pipeline import AnswerPipeline
from gateway.evaluation.beir import BenchmarkError, field_of, first_use, records
from gateway.evaluation.metrics import percentile
from gateway.evaluation.retrieval import Scope
from gateway.policy.model import Policy
from gateway.retrieval.scope import RequestScope
from gateway.storage.layout import ServedIndex
from gateway.telemetry.stages import StageClock

_MARKER = re.compile(r"\[\d+\]")
_ARTICLES = re.compile(r"\b(a|an|the)\b")
TOP_K = 10  # candidates per answer, as POST /answer's default


@dataclass(frozen=True)
class AnswerQuestion:
    id: str
    question: str
    answers: tuple[str, ...]
    impossible: bool
    gold_passage: str


def load_answer_questions(path: Path) -> list[AnswerQuestion]:
    questions = []
    seen: dict[str, int] = {}
    for number, r in records(path):
        where = f"{path}:{number}"
        impossible = r.get("is_impossible", False)
        if not isinstance(impossible, bool):  # the string "false" would count as true
            raise BenchmarkError(
                f"{where}: is_impossible must be true or false, not {impossible!r:.20}"
            )
        question = AnswerQuestion(
            field_of(r, ("id", "_id"), where),
            field_of(r, ("question", "text"), where),
            _golds(r.get("answers", []), where),
            impossible,
            field_of(r, ("gold_passage_id",), where),
        )
        first_use(seen, question.id, path, number)
        questions.append(question)
    if not questions:
        raise BenchmarkError(f"{path}: no questions")
    return questions


def _golds(answers: object, where: str) -> tuple[str, ...]:
    """Gold strings, or SQuAD's own answer objects (`{"text": ..., "answer_start": ...}`)
    by their text; anything else is refused, not scored as the text of its repr."""
    refused = BenchmarkError(
        f"{where}: answers must be a list of strings, or of SQuAD answer objects "
        '({"text": ..., "answer_start": ...})'
    )
    if not isinstance(answers, list):
        raise refused
    texts = []
    for answer in answers:
        text = answer.get("text") if isinstance(answer, dict) else answer
        if not isinstance(text, str):
            raise refused
        texts.append(text)
    return tuple(texts)


def normalise(text: str) -> str:
    """SQuAD's answer normalisation; citation markers go first."""
    text = _MARKER.sub(" ", text).lower()
    text = "".join(c for c in text if c not in string.punctuation)
    return " ".join(_ARTICLES.sub(" ", text).split())


def squad_f1(prediction: str, golds: Iterable[str]) -> float:
    predicted = normalise(prediction).split()
    best = 0.0
    for gold in golds:
        wanted = normalise(gold).split()
        common = sum((Counter(predicted) & Counter(wanted)).values())
        if common:
            precision, recall = common / len(predicted), common / len(wanted)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


@dataclass
class AnswerReport:
    questions: dict[str, int]  # per class
    answered: float  # answerable questions not abstained
    gold_cited: float
    gold_contained: float
    squad_f1: float
    unanswerable_abstained: float
    off_corpus_abstained: float
    median_words: float  # answers given, citation markers included
    uncited_answers: int  # answers without a citation: must be 0
    reasons: dict[str, int] = field(default_factory=dict)  # abstentions by reason
    latency_ms: dict[str, float] = field(default_factory=dict)

    def table(self) -> str:
        counts = ", ".join(f"{n} {kind}" for kind, n in self.questions.items())
        rows = [
            f"{counts} questions, through the answer pipeline ({TOP_K} candidates)",
            f"answerable: answered {self.answered:.1%}, gold paragraph cited "
            f"{self.gold_cited:.1%}, gold answer contained {self.gold_contained:.1%}, "
            f"SQuAD F1 {self.squad_f1:.3f}",
            f"unanswerable abstained {self.unanswerable_abstained:.1%}; "
            f"off-corpus abstained {self.off_corpus_abstained:.1%}",
            f"median answer {self.median_words:.0f} words; answers without a citation: "
            f"{self.uncited_answers}; abstentions: "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.reasons.items())),
            f"answer latency in process, 1 client: p50 {self.latency_ms['p50']:.0f} ms, "
            f"p95 {self.latency_ms['p95']:.0f} ms",
        ]
        return "\n".join(rows)


@dataclass(frozen=True)
class _Asked:
    question: AnswerQuestion
    kind: str
    answer: Answer
    cited_documents: list[str]
    ms: float


def evaluate_answers(
    index: ServedIndex,
    pipeline: AnswerPipeline,
    policy: Policy,
    scope: Scope,
    questions: Sequence[AnswerQuestion],
    corpus_ids: set[str],
) -> AnswerReport:
    caller = scope.caller()

    def kind(q: AnswerQuestion) -> str:
        if q.gold_passage not in corpus_ids:
            return "off-corpus"
        return "unanswerable" if q.impossible else "answerable"

    async def run() -> list[_Asked]:
        asked = []
        for q in questions:
            started = time.perf_counter()
            outcome = await pipeline.answer(
                RequestScope(index, policy, caller, q.question, TOP_K, StageClock())
            )
            elapsed = (time.perf_counter() - started) * 1000
            cited = [e.hit.doc_id for _n, e in outcome.citations]
            asked.append(_Asked(q, kind(q), outcome.answer, cited, elapsed))
        return asked

    asked = asyncio.run(run())
    by_kind: dict[str, list[_Asked]] = {"answerable": [], "unanswerable": [], "off-corpus": []}
    for a in asked:
        by_kind[a.kind].append(a)
    answerable = by_kind["answerable"]
    given = [a for a in asked if not a.answer.abstained]

    def share(values: list[bool]) -> float:
        return sum(values) / len(values) if values else 0.0

    def contains_gold(a: _Asked) -> bool:
        text = normalise(a.answer.text)
        return any(gold and gold in text for gold in map(normalise, a.question.answers))

    latencies = [a.ms for a in asked]
    return AnswerReport(
        questions={k: len(v) for k, v in by_kind.items()},
        answered=share([not a.answer.abstained for a in answerable]),
        gold_cited=share([a.question.gold_passage in a.cited_documents for a in answerable]),
        gold_contained=share([contains_gold(a) for a in answerable]),
        squad_f1=statistics.fmean(squad_f1(a.answer.text, a.question.answers) for a in answerable)
        if answerable
        else 0.0,
        unanswerable_abstained=share([a.answer.abstained for a in by_kind["unanswerable"]]),
        off_corpus_abstained=share([a.answer.abstained for a in by_kind["off-corpus"]]),
        median_words=statistics.median(len(a.answer.text.split()) for a in given) if given else 0.0,
        uncited_answers=sum(1 for a in given if not a.cited_documents),
        reasons=dict(Counter(a.answer.reason for a in asked if a.answer.reason)),
        latency_ms={"p50": percentile(latencies, 50), "p95": percentile(latencies, 95)},
    )
