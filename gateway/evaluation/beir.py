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


def utf8(path: Path, data: bytes, line: int = 1) -> str:
    """`data`, all of `path` or its line `line`, as text; refused, naming the file and the
    line, unless it is UTF-8 (Python's own message names neither)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line += data.count(b"\n", 0, exc.start)
        raise BenchmarkError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x}): save it as UTF-8"
        ) from None


def lines(path: Path) -> Iterator[tuple[int, str]]:
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            yield number, utf8(path, raw, number)


def records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, line in lines(path):
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


def first_use(seen: dict[str, int], key: str, path: Path, number: int) -> None:
    """Refuses an ID given twice: a document would be ingested once (or refused by the
    catalog) and a query scored twice."""
    if key in seen:
        raise BenchmarkError(f"{path}:{number}: ID {key!r} again (first on line {seen[key]})")
    seen[key] = number


def load_corpus(path: Path) -> list[Passage]:
    passages: list[Passage] = []
    seen: dict[str, int] = {}
    for n, r in records(path):
        passage = Passage(
            doc_id=field_of(r, ("_id", "id", "doc_id"), f"{path}:{n}"),
            title=str(r.get("title") or ""),
            text=field_of(r, ("text",), f"{path}:{n}"),
        )
        first_use(seen, passage.doc_id, path, n)
        passages.append(passage)
    if not passages:
        raise BenchmarkError(f"{path}: no documents")
    return passages


def load_queries(path: Path) -> list[Query]:
    queries: list[Query] = []
    seen: dict[str, int] = {}
    for n, r in records(path):
        query = Query(
            query_id=field_of(r, ("_id", "id"), f"{path}:{n}"),
            text=field_of(r, ("text", "question", "query"), f"{path}:{n}"),
        )
        first_use(seen, query.query_id, path, n)
        queries.append(query)
    return queries


def load_qrels(path: Path) -> dict[str, dict[str, int]]:
    """query ID -> {document ID: relevance}; a header row (`query-id ...`) is skipped."""
    qrels: dict[str, dict[str, int]] = {}
    rows = csv.reader((line for _number, line in lines(path)), delimiter="\t")
    for number, row in enumerate(rows, start=1):
        if not row or (number == 1 and not row[-1].strip().lstrip("-").isdigit()):
            continue
        if len(row) < 3:
            raise BenchmarkError(f"{path}:{number}: expected query-id, corpus-id, score")
        try:
            score = int(row[-1])
        except ValueError:
            raise BenchmarkError(f"{path}:{number}: score {row[-1]!r} is not an integer") from None
        qrels.setdefault(row[0], {})[row[-2]] = score
    return qrels
