"""Chunking text without sentence breaks: linear in the text, the same cuts as taking one
word at a time, and a word too long for a chunk cut by characters so that every chunk
keeps the token bound; a section's heading a line and a sentence of its own. The model's
own counter is its tokenizer only (no torch)."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable

import pytest

from gateway.ingest.chunk import ChunkingOptions, chunk_text, opens_with_heading, split_sentences

PHRASE = "refunds are paid within five working days of the request unless"
WORDS = PHRASE.split()


@pytest.fixture(scope="module")
def count_tokens() -> Callable[[str], int]:
    from gateway.embedding import Embedder  # its tokenizer; the model loads on first use

    return Embedder().count_tokens


def one_word_at_a_time(
    text: str, count: Callable[[str], int], max_tokens: int
) -> list[tuple[str, int]]:
    """The rule `_split_long` keeps (its first version): a word joins the run while the
    run with it still fits, the run counted whole for every word."""
    pieces: list[list[str]] = [[]]
    for word in text.split():
        if pieces[-1] and count(" ".join([*pieces[-1], word])) > max_tokens:
            pieces.append([])
        pieces[-1].append(word)
    return [(" ".join(p), count(" ".join(p))) for p in pieces]


def run_on(words: int) -> str:
    """Natural words, numbers and punctuation, and never a sentence break."""
    extra = ["RPL-14.2", "e.g.", "(see §4)", "https://example.com/a/b?c=d", "2,048", "naïve"]
    vocabulary = WORDS + extra
    return " ".join(vocabulary[(i * 7 + i // 5) % len(vocabulary)] for i in range(words))


def test_a_run_without_sentence_breaks_is_counted_once_not_per_word() -> None:
    """Counting the growing run again for every word tokenized each character about as
    many times as a chunk has words (0.2 ms a word with the model's tokenizer, 4,000 s
    for 100 MB). Now each word is counted once, each chunk once more, and the text as a
    whole once: a few times its own length in all, whatever its length."""
    counted: list[int] = []

    def count(text: str) -> int:
        counted.append(len(text))
        return len(text.split())

    text = run_on(20_000)
    chunks = chunk_text(text, count, ChunkingOptions(max_tokens=96, overlap_tokens=0))
    assert sum(counted) < 3 * len(text)  # one word at a time: about 50 times
    assert [c for c, _ in chunks] == [c for c, _ in one_word_at_a_time(text, count, 96)]


@pytest.mark.parametrize(("max_tokens", "overlap"), [(96, 24), (32, 0), (224, 112)])
def test_the_cuts_are_those_of_one_word_at_a_time(
    count_tokens: Callable[[str], int], max_tokens: int, overlap: int
) -> None:
    """Byte for byte, with the model's tokenizer: counting each word once finds the same
    cuts and the same counts, since the tokenizer splits at spaces before anything else.
    (Each run is a unit of its own that the next does not fit beside, and a chunk never
    repeats its first unit: the chunks are the runs.)"""
    text = run_on(3_000)
    options = ChunkingOptions(max_tokens=max_tokens, overlap_tokens=overlap)
    expected = one_word_at_a_time(text, count_tokens, max_tokens)
    assert len(expected) > 10
    assert chunk_text(text, count_tokens, options) == expected


def test_a_counter_that_does_not_add_up_over_words_gets_the_same_cuts() -> None:
    """Characters, spaces included, are more than the words' own: runs shrink to fit."""
    text = run_on(2_000)
    options = ChunkingOptions(max_tokens=64, overlap_tokens=0)
    assert chunk_text(text, len, options) == one_word_at_a_time(text, len, 64)


def test_a_word_longer_than_a_chunk_is_cut_to_the_bound(
    count_tokens: Callable[[str], int],
) -> None:
    """A run of letters without spaces or punctuation over 100 characters is one [UNK] to
    the model: 2 MB of it was one chunk of 2 MB counted as 1 token. A run that is many
    tokens to it (Chinese, a token a character) was one chunk over the bound."""
    options = ChunkingOptions(max_tokens=32, overlap_tokens=0)
    for word in ("a" * 20_000, "中文" * 200, "x" * 150 + "-y" * 40):
        text = f"Before it. {word} after it."
        chunks = chunk_text(text, count_tokens, options)
        assert all(n <= 32 and n == count_tokens(c) for c, n in chunks)
        assert all(len(c) <= 32 * 100 for c, _ in chunks)
        assert "".join(c for c, _ in chunks).replace(" ", "") == text.replace(" ", "")
    [short] = chunk_text("x" * 150 + " after it.", count_tokens, options)  # 2 tokens: whole
    assert short == ("x" * 150 + " after it.", count_tokens("x" * 150 + " after it."))


def test_sentences_of_unreadable_words_keep_the_character_bound(
    count_tokens: Callable[[str], int],
) -> None:
    """Each sentence one word of thousands of letters and a full stop, two tokens: 48 of
    them fitted a chunk of 96 tokens (240 KB). A chunk holds at most 100 characters a
    token, the sentences it repeats from the chunk before included."""
    sentences = [f"{'B' * 2_000}." for _ in range(4)] + [f"{'C' * 9_000}."]
    sentences += [f"{'D' * 5_000}." for _ in range(6)]
    options = ChunkingOptions(max_tokens=96, overlap_tokens=24)
    chunks = chunk_text(" ".join(sentences), count_tokens, options)
    assert len(chunks) >= 8 and all(len(c) <= 96 * 100 for c, _ in chunks)
    assert all(n == count_tokens(c) for c, n in chunks)
    assert chunks[0] == (" ".join(sentences[:4]), 8)  # four fit, with no overlap to keep
    words = chunk_text(" ".join(["x" * 150] * 200), count_tokens, options)  # one sentence
    assert [n for _, n in words] == [63, 63, 63, 11]  # 96 of those words are 14 KB
    assert all(len(c) <= 96 * 100 for c, _ in words)


def test_a_cut_word_reads_as_in_the_document(count_tokens: Callable[[str], int]) -> None:
    """The slices of a word cut by characters were joined with spaces: a Chinese paragraph
    (no spaces to cut at) or a long key came back from search, and in quoted answers, with
    spaces the document never had. Each chunk is now a piece of the text as written, and
    its count the model's own."""
    chinese = "退款将在五个工作日内支付给原来的银行卡。" * 40
    key = base64.b64encode(b"".join(hashlib.sha256(bytes([i])).digest() for i in range(200)))
    for max_tokens in (224, 96, 32):
        options = ChunkingOptions(max_tokens=max_tokens, overlap_tokens=min(32, max_tokens // 4))
        for word in (chinese, key.decode(), "中文" * 200, "x" * 150 + "-y" * 40):
            text = f"Before it. {word} after it."
            chunks = chunk_text(text, count_tokens, options)
            for chunk, tokens in chunks:
                assert chunk in text, (max_tokens, chunk[:40])
                assert tokens == count_tokens(chunk) and tokens <= max_tokens
            assert "".join(c for c, _ in chunks).replace(" ", "") == text.replace(" ", "")


# -- headings -------------------------------------------------------------------------------

PARTY = "The annual summer party takes place in July at the lake. Families are welcome."


@pytest.mark.parametrize(
    ("section", "heading"),
    [
        ("# Laptop encryption\n\n", "# Laptop encryption"),
        ("# Laptop encryption\n", "# Laptop encryption"),  # no blank line after it
        ("## 2. Setup guide\n\n", "## 2. Setup guide"),  # a full stop in it cuts nothing
    ],
)
def test_a_heading_keeps_its_line_and_is_a_sentence_of_its_own(
    count_tokens: Callable[[str], int], section: str, heading: str
) -> None:
    """A heading was joined to the sentence below it with a space ("# Laptop encryption The
    annual summer party ..."): one sentence, which the heading's words made an answer to
    questions about the heading. The token count is the same: the model reads a line break
    as a space."""
    [(text, tokens)] = chunk_text(section + PARTY, count_tokens)
    assert text == f"{heading}\n{PARTY}"
    assert tokens == count_tokens(text) == count_tokens(" ".join(text.split()))
    assert split_sentences(text) == [heading, *split_sentences(PARTY)]
    assert opens_with_heading(text)


def test_a_chunk_that_is_only_a_heading_ends_with_its_line_break(
    count_tokens: Callable[[str], int],
) -> None:
    """A heading followed by another heading is a section of its own: read back, the chunk
    still says it is a heading, not a sentence."""
    [(text, _)] = chunk_text("# Laptop encryption\n", count_tokens)
    assert text == "# Laptop encryption\n"
    assert split_sentences(text) == ["# Laptop encryption"] and opens_with_heading(text)


def test_only_the_first_chunk_of_a_section_holds_its_heading(
    count_tokens: Callable[[str], int],
) -> None:
    options = ChunkingOptions(max_tokens=32, overlap_tokens=16)
    chunks = chunk_text("# Laptop encryption\n\n" + " ".join([PARTY] * 6), count_tokens, options)
    assert chunks[0][0].startswith("# Laptop encryption\nThe annual")
    assert all("#" not in c and "\n" not in c for c, _ in chunks[1:])
    assert all(n == count_tokens(c) <= 32 for c, n in chunks)


def test_chunks_ingested_before_headings_kept_their_line_split_as_they_did() -> None:
    """Their sentence vectors were stored for these sentences: the same count, or the
    answerer would embed them all again."""
    old = "# Opening hours The flagship store opens at nine. It closes at eight."
    assert split_sentences(old) == [
        "# Opening hours The flagship store opens at nine.",
        "It closes at eight.",
    ]
    assert not opens_with_heading(old)
