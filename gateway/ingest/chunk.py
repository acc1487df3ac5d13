"""Sentence-aware chunking sized in tokens of the embedding model.

A document is cut into sections at its Markdown headings (the chunks' parents); within a
section, sentences are packed greedily into chunks of at most `max_tokens`, and each chunk
after the first repeats trailing sentences of the previous one (up to `overlap_tokens`) so
that an answer straddling a boundary is still whole in one chunk.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from gateway.domain import Chunk, Document, chunk_id_for
from gateway.policy.model import Chunking as ChunkingOptions

# A sentence ends at . ! or ? followed by space and an upper-case letter, digit or quote,
# which keeps "e.g. the" and "RPL-14.2" together.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[A-Z0-9#*-])")
_PARAGRAPH = re.compile(r"\n\s*\n")
_HEADING = re.compile(r"#{1,6}[ \t]+\S")


__all__ = ["DEFAULT_CHUNKING", "ChunkingOptions", "chunk_document", "sentence_spans"]
DEFAULT_CHUNKING = ChunkingOptions()  # the policy's `chunking:` defaults


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of each sentence in `text`, trimmed of whitespace.

    Offsets, not copies, so that vectors pooled over these spans at ingest (late chunking)
    line up with the sentences the answerer reads back from the same chunk text.
    """
    spans: list[tuple[int, int]] = []
    cuts = [m.span() for m in _SENTENCE_END.finditer(text)]
    cuts += [m.span() for m in _PARAGRAPH.finditer(text)]
    start = 0
    for cut_start, cut_end in [*sorted(cuts), (len(text), len(text))]:
        if cut_start < start:
            continue  # a paragraph break that a sentence break already covers
        piece = text[start:cut_start]
        stripped = piece.strip()
        if stripped:
            left = start + (len(piece) - len(piece.lstrip()))
            spans.append((left, left + len(stripped)))
        start = cut_end
    return spans


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, each with its whitespace collapsed to single spaces."""
    return [" ".join(text[a:b].split()) for a, b in sentence_spans(text)]


def _split_long(sentence: str, max_tokens: int, count: Callable[[str], int]) -> list[str]:
    """Cut an over-long sentence into word runs that fit."""
    pieces: list[str] = []
    words: list[str] = []
    for word in sentence.split():
        if words and count(" ".join([*words, word])) > max_tokens:
            pieces.append(" ".join(words))
            words = []
        words.append(word)
    if words:
        pieces.append(" ".join(words))
    return pieces


def chunk_text(
    text: str, count: Callable[[str], int], options: ChunkingOptions | None = None
) -> list[tuple[str, int]]:
    """(chunk text, token count) pairs covering the whole text in order."""
    options = options or DEFAULT_CHUNKING
    units: list[tuple[str, int]] = []
    for sentence in split_sentences(text):
        n = count(sentence)
        if n <= options.max_tokens:
            units.append((sentence, n))
        else:
            units.extend((p, count(p)) for p in _split_long(sentence, options.max_tokens, count))

    chunks: list[tuple[str, int]] = []
    current: list[tuple[str, int]] = []
    size = 0
    for unit in units:
        if current and size + unit[1] > options.max_tokens:
            chunks.append((" ".join(u[0] for u in current), size))
            current, size = _overlap(current, options, unit[1])
        current.append(unit)
        size += unit[1]
    if current:
        chunks.append((" ".join(u[0] for u in current), size))
    return chunks


def _overlap(
    previous: list[tuple[str, int]], options: ChunkingOptions, incoming: int
) -> tuple[list[tuple[str, int]], int]:
    """Trailing sentences of the previous chunk that fit the overlap and the next chunk."""
    kept: list[tuple[str, int]] = []
    size = 0
    for unit in reversed(previous[1:]):  # never repeat a whole chunk
        if (
            size + unit[1] > options.overlap_tokens
            or size + unit[1] + incoming > options.max_tokens
        ):
            break
        kept.insert(0, unit)
        size += unit[1]
    return kept, size


def sections(text: str) -> list[str]:
    """The text cut before each Markdown heading (outside code fences): the parents of the
    chunks. A text without headings is one section."""
    parts: list[list[str]] = [[]]
    fenced = False
    for line in text.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        if not fenced and _HEADING.match(line) and any(p.strip() for p in parts[-1]):
            parts.append([])
        parts[-1].append(line)
    return [joined for part in parts if (joined := "\n".join(part)).strip()]


def chunk_document(
    doc: Document, count: Callable[[str], int], options: ChunkingOptions | None = None
) -> list[Chunk]:
    """Chunks never straddle sections, so each chunk has one parent section."""
    options = options or DEFAULT_CHUNKING
    pieces = [
        (parent, text, tokens)
        for parent, section in enumerate(sections(doc.text))
        for text, tokens in chunk_text(section, count, options)
    ]
    return [
        Chunk(
            chunk_id=chunk_id_for(doc.doc_id, doc.version, ordinal),
            doc_id=doc.doc_id,
            version=doc.version,
            ordinal=ordinal,
            title=doc.title,
            uri=doc.uri,
            text=text,
            token_count=tokens,
            visibility=doc.visibility,
            parent=parent,
        )
        for ordinal, (parent, text, tokens) in enumerate(pieces)
    ]
