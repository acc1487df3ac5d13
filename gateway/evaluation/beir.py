"""Read a BEIR-format benchmark: corpus.jsonl, queries.jsonl and a qrels TSV.

Also accepts the SQuAD slice's field names (`id`/`question` for queries), so the project's
own data and public BEIR sets load the same way. Problems name the file and line.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class BenchmarkError(ValueError):
    """A benchmark file that cannot be read as BEIR; the message names file and line."""


@dataclass(frozen=True)
class Passage:
    doc_id: str
    title: str
    text: str


@dataclass(frozen=True)
class Query:
    query_id: str
    text: str


def records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BenchmarkError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise BenchmarkError(f"{path}:{number}: expected a JSON object")
            yield number, record


def field_of(record: dict[str, Any], names: tuple[str, ...], where: str) -> str:
    for name in names:
        value = record.get(name)
        if isinstance(value, str | int) and str(value).strip():
            return str(value)
    raise BenchmarkError(f"{where}: missing {' or '.join(names)}")


def load_corpus(path: Path) -> list[Passage]:
    return [
        Passage(
            doc_id=field_of(r, ("_id", "id", "doc_id"), f"{path}:{n}"),
            title=str(r.get("title") or ""),
            text=field_of(r, ("text",), f"{path}:{n}"),
        )
        for n, r in records(path)
    ]


def load_queries(path: Path) -> list[Query]:
    return [
        Query(
            query_id=field_of(r, ("_id", "id"), f"{path}:{n}"),
            text=field_of(r, ("text", "question", "query"), f"{path}:{n}"),
        )
        for n, r in records(path)
    ]


def load_qrels(path: Path) -> dict[str, dict[str, int]]:
    """query ID -> {document ID: relevance}; a header row (`query-id ...`) is skipped."""
    qrels: dict[str, dict[str, int]] = {}
    with path.open(encoding="utf-8", newline="") as handle:
        for number, row in enumerate(csv.reader(handle, delimiter="\t"), start=1):
            if not row or (number == 1 and not row[-1].strip().lstrip("-").isdigit()):
                continue
            if len(row) < 3:
                raise BenchmarkError(f"{path}:{number}: expected query-id, corpus-id, score")
            try:
                score = int(row[-1])
            except ValueError:
                raise BenchmarkError(
                    f"{path}:{number}: score {row[-1]!r} is not an integer"
                ) from None
            qrels.setdefault(row[0], {})[row[-2]] = score
    return qrels
