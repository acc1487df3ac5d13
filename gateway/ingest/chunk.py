"""Sentence-aware chunking sized in tokens of the embedding model.

A document is cut into sections at its Markdown headings (the chunks' parents); within a
section, sentences are packed greedily into chunks of at most `max_tokens`, and each chunk
after the first repeats trailing sentences of the previous one (up to `overlap_tokens`) so
that an answer straddling a boundary is still whole in one chunk. A sentence too long for
a chunk is cut between words, and a word too long for one between characters; no chunk
holds more than `_LONGEST_WORD` characters a token, whatever the counter says of a word it
cannot read. The slices of a cut word are joined as they stand in the text, without a
space, and each slice after the first starts a chunk (with no overlap): a chunk's text is
always the document's own (its whitespace collapsed), never a word with spaces put in.

A section's heading stays a line of its own in the first chunk of the section (and a chunk
that is only a heading ends with its line break): a heading is a sentence of its own, not
read as part of the sentence below it, and the answerer never quotes it.
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
# The heading line a text opens with, ended by a line break. Chunks ingested before
# headings kept their line break have none: their sentences are cut as they always were,
# so that the sentence vectors stored with them still match.
_OPENING_HEADING = re.compile(r"\s*#{1,6}[ \t]+\S[^\n]*(?=\n)")
# Characters a token may stand for, at most: the model's WordPiece reads a longer word as
# one [UNK], so a chunk of `max_tokens` holds at most this many times as many characters.
_LONGEST_WORD = 100
_KNOWN_WORDS = 100_000  # words whose counts one over-long sentence keeps


__all__ = [
    "DEFAULT_CHUNKING",
    "ChunkingOptions",
    "chunk_document",
    "opens_with_heading",
    "sentence_spans",
]
DEFAULT_CHUNKING = ChunkingOptions()  # the policy's `chunking:` defaults


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of each sentence in `text`, trimmed of whitespace.

    Offsets, not copies, so that vectors pooled over these spans at ingest (late chunking)
    line up with the sentences the answerer reads back from the same chunk text. A heading
    line that `text` opens with is one sentence, whatever punctuation it holds ("# 2. Setup").
    """
    spans: list[tuple[int, int]] = []
    cuts = [m.span() for m in _SENTENCE_END.finditer(text)]
    cuts += [m.span() for m in _PARAGRAPH.finditer(text)]
    if heading := _OPENING_HEADING.match(text):
        cuts = [cut for cut in cuts if cut[0] >= heading.end()] + [(heading.end(), heading.end())]
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


def opens_with_heading(text: str) -> bool:
    """Whether the first sentence of `text` (`sentence_spans`) is a Markdown heading."""
    return _OPENING_HEADING.match(text) is not None


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, each with its whitespace collapsed to single spaces."""
    return [" ".join(text[a:b].split()) for a, b in sentence_spans(text)]


# (text, tokens, glued): glued is a slice of a cut word after its first, which continues
# the text before it with no space between.
_Unit = tuple[str, int, bool]


def _joined(units: list[_Unit], heading: bool = False) -> str:
    """The units' text as it stands in the document: a space between words, none inside a
    cut word, and a line break after the first unit when it is a `heading`."""
    text = "".join(
        ("" if glued or i == 0 else "\n" if heading and i == 1 else " ") + text
        for i, (text, _, glued) in enumerate(units)
    )
    return text + "\n" if heading and len(units) == 1 else text


def _cut(word: str, max_tokens: int, count: Callable[[str], int]) -> list[_Unit]:
    """A word too long for any chunk, cut by characters into counted slices that fit: at
    most `_LONGEST_WORD` characters (read as word pieces, not one [UNK]), halved until
    within `max_tokens` (a script without spaces, such as Chinese, has a token a character).
    """
    slices: list[_Unit] = []
    todo = [word[i : i + _LONGEST_WORD] for i in range(0, len(word), _LONGEST_WORD)][::-1]
    while todo:  # the next slice last
        piece = todo.pop()
        if (n := count(piece)) <= max_tokens or len(piece) == 1:
            slices.append((piece, n, bool(slices)))
        else:
            todo += [piece[len(piece) // 2 :], piece[: len(piece) // 2]]
    return slices


def _split_long(
    sentence: str, max_tokens: int, count: Callable[[str], int], max_chars: int
) -> list[_Unit]:
    """Cut an over-long sentence into counted word runs that fit: each run takes words
    while it still fits, as many as one word at a time would, but with each word counted
    once, not the growing run counted again for every word (quadratic in `max_tokens`).
    A word that fits no run is cut by characters (`_cut`)."""
    words: list[_Unit] = []
    known: dict[str, int] = {}  # natural text repeats its words
    for word in sentence.split():
        if len(word) > max_chars:  # not counted whole: megabytes of one word are one [UNK]
            words += _cut(word, max_tokens, count)
            continue
        if (n := known.get(word)) is None:
            if len(known) >= _KNOWN_WORDS:
                known.clear()
            n = known[word] = count(word)
        words += _cut(word, max_tokens, count) if n > max_tokens else [(word, n, False)]
    pieces: list[_Unit] = []
    start = 0
    while start < len(words):
        end, size, chars = start + 1, words[start][1], len(words[start][0])
        while end < len(words) and (
            size + words[end][1] <= max_tokens and chars + 1 + len(words[end][0]) <= max_chars
        ):
            size, chars, end = size + words[end][1], chars + 1 + len(words[end][0]), end + 1
        # The words' counts add up to the run's for the model's tokenizer, which splits at
        # spaces first; a counter that does not (or a cut word's slices, read together)
        # gets runs one word shorter until they fit.
        text = _joined(words[start:end])
        while (tokens := count(text)) > max_tokens and end > start + 1:
            end -= 1
            text = _joined(words[start:end])
        pieces.append((text, tokens, words[start][2]))
        start = end
    return pieces


def chunk_text(
    text: str, count: Callable[[str], int], options: ChunkingOptions | None = None
) -> list[tuple[str, int]]:
    """(chunk text, token count) pairs covering the whole text in order."""
    options = options or DEFAULT_CHUNKING
    max_chars = options.max_tokens * _LONGEST_WORD
    heading = _HEADING.match(text.lstrip()) is not None  # the first unit, a section's heading
    units: list[_Unit] = []
    for sentence in split_sentences(text):
        if len(sentence) <= max_chars and (n := count(sentence)) <= options.max_tokens:
            units.append((sentence, n, False))
        else:
            units += _split_long(sentence, options.max_tokens, count, max_chars)

    chunks: list[tuple[str, int]] = []
    current: list[_Unit] = []
    size = chars = 0  # chars: of the chunk's text so far and a space after it
    for unit in units:
        # A run that goes on with a cut word starts a chunk of its own: read together with
        # the run before it, the word's slices would count otherwise (one [UNK]).
        glued = unit[2]
        if current and (
            glued or size + unit[1] > options.max_tokens or chars + len(unit[0]) > max_chars
        ):
            chunks.append((_joined(current, heading and not chunks), size))
            current, size = ([], 0) if glued else _overlap(current, options, unit, max_chars)
            chars = sum(len(u[0]) + 1 for u in current)
        current.append(unit)
        size += unit[1]
        chars += len(unit[0]) + 1
    if current:
        chunks.append((_joined(current, heading and not chunks), size))
    return chunks


def _overlap(
    previous: list[_Unit],
    options: ChunkingOptions,
    incoming: _Unit,
    max_chars: int,
) -> tuple[list[_Unit], int]:
    """Trailing sentences of the previous chunk that fit the overlap and the next chunk."""
    kept: list[_Unit] = []
    size, chars = 0, len(incoming[0])
    for unit in reversed(previous[1:]):  # never repeat a whole chunk
        if (
            size + unit[1] > options.overlap_tokens
            or size + unit[1] + incoming[1] > options.max_tokens
            or chars + len(unit[0]) + 1 > max_chars
        ):
            break
        kept.insert(0, unit)
        size += unit[1]
        chars += len(unit[0]) + 1
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
