"""Citations checked after generation: only numbers of evidence the model was given count.

A model can cite a block it was not given, or invent [7] out of five. Each marker's numbers
are kept if they name a given block, and dropped (and counted) otherwise; a marker left
empty disappears. Kept numbers are renumbered [1], [2], ... in the order the answer first
uses them, as the extractive answerer numbers its citations.

A document writes bracketed numbers of its own ("as described in [2]", a reference list's
"[1] Smith"): quoted as they are, they would read as the answer's citations. So an answer
quotes them escaped, `\\[2\\]` (Markdown shows "[2]"), which is no marker. A bracket right
after a letter or digit (`buffer[0]`) is code, no marker in an answer, and quoted as is.
The LLM is shown every bracketed number of the evidence escaped, code's included (a
model's own marker may follow a word, "5 days[1]"), so what it copies is never read as
its citation; code's brackets are given back their form afterwards (`restore_code`).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

MAX_DIGITS = 6  # a cited number longer than this names no block
_NUMBERS = r"(\s*\d+\s*(?:[,;]\s*\d+\s*)*)"
# A citation marker in what an LLM wrote; an escaped `\[2\]` is a document's text.
MARKER = re.compile(rf"\s?(?<!\\)\[{_NUMBERS}\]")
# A document's bracketed numbers that an answer escapes: all of them (for the LLM's
# prompt), or those not stuck to a word (quoted in an answer; `buffer[0]` stays).
_DOCUMENT_ANY = re.compile(rf"(?<!\\)\[{_NUMBERS}\]")
_DOCUMENT_LOOSE = re.compile(rf"(?<![\w\\])\[{_NUMBERS}\]")
_ESCAPED_CODE = re.compile(rf"(?<=\w)\\\[{_NUMBERS}\\\]")


def escape_quoted(text: str, *, code_too: bool = False) -> str:
    """A document's `text` with its bracketed numbers escaped as `\\[n\\]`, so that none
    reads as a citation: those stuck to a word too when `code_too` (the LLM's evidence)."""
    pattern = _DOCUMENT_ANY if code_too else _DOCUMENT_LOOSE
    return pattern.sub(r"\\[\1\\]", text)


def restore_code(text: str) -> str:
    """`buffer\\[0\\]` as the LLM copied it from its evidence, back to `buffer[0]`."""
    return _ESCAPED_CODE.sub(r"[\1]", text)


@dataclass(frozen=True)
class Checked:
    text: str  # with markers renumbered and invalid ones removed
    cited: list[int]  # evidence numbers, in the order of the renumbered [1], [2], ...
    dropped: int  # cited numbers that named no given block


def check_citations(text: str, given: Collection[int]) -> Checked:
    cited: list[int] = []
    dropped = 0

    def rewrite(match: re.Match[str]) -> str:
        nonlocal dropped
        # No evidence list is millions long; past Python's 4,300 digits int() raises.
        numbers = [
            int(digits) if len(digits) <= MAX_DIGITS else -1
            for digits in (part.strip() for part in re.split(r"[,;]", match.group(1)))
        ]
        stuck = not match.group(0).startswith(" ") and (
            re.fullmatch(r"\w", text[match.start() - 1 : match.start()]) is not None
        )
        if stuck and not any(n in given for n in numbers):
            # Code the model quoted without its escape (`buffer[0]`, `arr[12]`): kept as
            # written, not a citation to drop; stuck to a word and naming a given block,
            # it is the model's own marker ("5 days[1]").
            return match.group(0)
        shown: list[int] = []
        for n in numbers:
            if n not in given:
                dropped += 1
                continue
            if n not in cited:
                cited.append(n)
            shown.append(cited.index(n) + 1)
        if not shown:
            return ""
        # A marker the model stuck to a word ("5 days[1]") gets its space: in an answer,
        # a bracket after a word is code's (`buffer[0]`), not a citation.
        lead = " " if match.group(0).startswith(" ") or stuck else ""
        return lead + "".join(f"[{k}]" for k in dict.fromkeys(shown))

    rewritten = MARKER.sub(rewrite, text)
    return Checked(re.sub(r"[ \t]{2,}", " ", rewritten).strip(), cited, dropped)
