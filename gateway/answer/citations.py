"""Citations checked after generation: only numbers of evidence the model was given count.

A model can cite a block it was not given, or invent [7] out of five. Each marker's numbers
are kept if they name a given block, and dropped (and counted) otherwise; a marker left
empty disappears. Kept numbers are renumbered [1], [2], ... in the order the answer first
uses them, as the extractive answerer numbers its citations.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

MAX_DIGITS = 6  # a cited number longer than this names no block
MARKER = re.compile(r"\s?\[(\s*\d+\s*(?:[,;]\s*\d+\s*)*)\]")


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
        shown: list[int] = []
        for part in re.split(r"[,;]", match.group(1)):
            digits = part.strip()
            # No evidence list is millions long; past Python's 4,300 digits int() raises.
            n = int(digits) if len(digits) <= MAX_DIGITS else -1
            if n not in given:
                dropped += 1
                continue
            if n not in cited:
                cited.append(n)
            shown.append(cited.index(n) + 1)
        if not shown:
            return ""
        lead = " " if match.group(0).startswith(" ") else ""
        return lead + "".join(f"[{k}]" for k in dict.fromkeys(shown))

    rewritten = MARKER.sub(rewrite, text)
    return Checked(re.sub(r"[ \t]{2,}", " ", rewritten).strip(), cited, dropped)
