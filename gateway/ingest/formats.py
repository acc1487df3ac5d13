"""Text out of HTML and PDF files: the only module importing BeautifulSoup and pypdf.

HTML headings become Markdown headings, so sections (the chunks' parents) follow the
page's own structure; scripts, styles, comments and navigation chrome are dropped (a
header or footer only when it is the page's: in an article or section it is part of
it). Inline elements join their text as shown (`un<b>believ</b>able`), only block
elements and `<br>` part words. PDF text is taken page by page, each page a paragraph.
Extraction never executes anything in the file.

An HTML file is read as UTF-8 when its bytes are UTF-8 (or by its byte order mark), else
by the charset it declares (`<meta charset>`, `http-equiv`), else as windows-1252: the
WHATWG encoding standard's fallback for an undeclared legacy page in Western locales,
where BeautifulSoup's statistical guess read French and Italian pages as windows-1250
(`naïve` as `naďve`, `très` as `trčs`).

A PDF's compressed streams can hold hundreds of times its size in text (a few kilobytes
drawing the same page a thousand times), so a PDF yields at most `PDF_CHARS_PER_BYTE`
characters per byte of the file (past a floor, `MIN_PDF_TEXT_CHARS`), and never more than
`MAX_PDF_TEXT_CHARS`: past that, extraction stops where it is, page by page and within a
page, and the file is refused (`TextTooLong`), before its whole text is ever held in
memory, and after seconds of pypdf's work rather than most of a minute.
"""

from __future__ import annotations

import codecs
import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bs4 import Tag

_DROP = ("script", "style", "noscript", "template", "nav", "svg", "form")
_CHROME = ("header", "footer")  # the page's are dropped; a section's are its own text
_SECTIONS = frozenset({"article", "section", "main", "aside"})
_HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")
_BLOCKS = (
    *("p", "li", "pre", "blockquote", "td", "th", "dd", "dt", "figcaption", "caption"),
    *("div", "section", "article", "main", "aside", "table", "ul", "ol", "dl"),
)
_NAMES = frozenset(_HEADINGS + _BLOCKS)
# Elements shown apart from the text around them: a space between their text and the
# rest, where inline elements (b, a, span, sub, ...) add none. Only _NAMES make parts.
_SPACED = _NAMES | {
    *("br", "hr", "tr", "thead", "tbody", "tfoot", "header", "footer", "address", "figure"),
    *("fieldset", "legend", "details", "summary", "hgroup", "dialog", "menu", "center"),
}
_SPACE = re.compile(r"[ \t\u00a0]+")
# Declared charsets read as windows-1252, as no declaration is: the WHATWG standard reads
# the Latin-1 and ASCII labels so (a "latin-1" page's 0x93 is a curly quote, not a control
# character); a page not UTF-8 that declares UTF-8 (or UTF-16, which an ASCII-compatible
# `<meta>` never is) is mislabelled; the rest are no web charsets, and would decode escapes
# or punycode written in the markup into other text (`\x00` into a NUL).
_READ_AS_UNDECLARED = frozenset(
    {"iso8859-1", "ascii", "utf-8", "utf-16", "utf-16-le", "utf-16-be", "utf-7"}
    | {"utf-32", "utf-32-le", "utf-32-be", "unicode-escape", "raw-unicode-escape"}
    | {"idna", "punycode", "undefined"}
)


# The most text one PDF may yield, in characters: the push API's body limit (32 MiB,
# `POST /admin/documents`), so no file brings in more text than a connector could push.
MAX_PDF_TEXT_CHARS = 32 * 1024 * 1024
# Below that, a PDF yields at most this many characters per byte of the file. Real PDFs
# hold under one (fonts, images, layout: two manuals in Debian's docs 0.24 and 0.27), a
# PDF of nothing but prose in deflated streams under two (1.8); a bomb holds thousands.
# At 100 a 24 KB bomb is refused after 2.4 M characters (about a second of pypdf's work)
# instead of 32 Mi (15-45 s). The floor keeps small files from being judged by their size.
PDF_CHARS_PER_BYTE = 100
MIN_PDF_TEXT_CHARS = 1024 * 1024


class TextTooLong(ValueError):
    """A file whose text runs past its limit; the message names the limit, no content."""


@dataclass(frozen=True)
class Extracted:
    text: str
    title: str | None


def _clean(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def _nearest_block(
    start: Tag | None, nearest: dict[int, Tag | None], names: frozenset[str] = _NAMES
) -> Tag | None:
    """The innermost element from `start` up named in `names`, headings and blocks unless
    told (None: there is none), as `find_parent` finds it, but each element's answer
    remembered in `nearest` (one per `names`): asking for
    every string of a page walks each element once, where `find_parent` walked all of a
    string's ancestors, quadratic in the nesting depth (thousands of unclosed tags)."""
    walked: list[int] = []
    found: Tag | None = None
    node = start
    while node is not None:
        if (key := id(node)) in nearest:
            found = nearest[key]
            break
        if node.name in names:
            found = node
            break
        walked.append(key)
        node = node.parent
    for key in walked:
        nearest[key] = found
    return found


def html_text(raw: bytes) -> str:
    """An HTML file's bytes as text: by its byte order mark; as UTF-8 when they are UTF-8;
    else by the charset the page declares; else as windows-1252. Bytes the encoding has no
    character for become U+FFFD, as a browser shows them."""
    from bs4.dammit import EncodingDetector

    data, marked = EncodingDetector.strip_byte_order_mark(raw)
    if marked:
        return data.decode(marked, "replace")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    declared = EncodingDetector.find_declared_encoding(data, is_html=True)
    try:
        name = codecs.lookup(declared).name if declared else "windows-1252"
    except LookupError:  # a label Python does not know (`x-sjis`): none usable
        name = "windows-1252"
    if name in _READ_AS_UNDECLARED:
        name = "windows-1252"
    try:
        return data.decode(name, "replace")
    except LookupError:  # a codec that is not text to text (`base64`, `rot13`)
        return data.decode("windows-1252", "replace")


def extract_html(raw: bytes) -> Extracted:
    # here: a process that reads no HTML is spared 50 ms
    from bs4 import BeautifulSoup, CData, Comment, Declaration, Doctype, ProcessingInstruction
    from bs4 import Tag as Element

    soup = BeautifulSoup(html_text(raw), "html.parser")
    sections: dict[int, Tag | None] = {}
    chrome = [t for t in soup(_CHROME) if _nearest_block(t.parent, sections, _SECTIONS) is None]
    for tag in [*soup(_DROP), *chrome]:
        tag.decompose()
    title = _clean(soup.title.get_text()) if soup.title else None
    body = soup.body or soup
    # Strings in document order; a new part starts whenever the nearest enclosing block
    # changes, so nested and interleaved blocks keep their reading order. Within a part,
    # a space only where a spaced element starts or ends between two strings.
    runs: list[tuple[object, list[str]]] = []
    nearest: dict[int, Tag | None] = {}  # by id(): each element's walk up is taken once
    spaced: dict[int, Tag | None] = {}
    gap, last = False, None  # a spaced element started since the last string; its one
    for node in body.descendants:
        if isinstance(node, Element):
            gap = gap or node.name in _SPACED
            continue
        if isinstance(node, (Comment, CData, Declaration, Doctype, ProcessingInstruction)):
            continue  # never shown: `<!-- TODO remove ... -->` is no text of the page
        block = _nearest_block(node.parent, nearest) or body
        around = _nearest_block(node.parent, spaced, _SPACED)
        if not runs or runs[-1][0] is not block:
            runs.append((block, []))
        elif gap or around is not last:
            runs[-1][1].append(" ")
        runs[-1][1].append(str(node))
        gap, last = False, around
    parts: list[str] = []
    for owner, strings in runs:
        text = _clean("".join(strings))
        name = getattr(owner, "name", "") or ""
        if not text:
            continue
        if name in _HEADINGS:
            parts.append(f"{'#' * int(name[1])} {text}")
            title = title or (text if name == "h1" else None)
        else:
            parts.append(text)
    return Extracted("\n\n".join(parts), title or None)


def extract_pdf(source: Path | bytes) -> Extracted:
    """A PDF's text and title, from its path or its bytes (as sources.py has read them)."""
    from pypdf import PdfReader  # here: a process that reads no PDF is spared 40 ms

    reader = PdfReader(io.BytesIO(source) if isinstance(source, bytes) else str(source))
    size = len(source) if isinstance(source, bytes) else source.stat().st_size
    limit = min(MAX_PDF_TEXT_CHARS, max(MIN_PDF_TEXT_CHARS, PDF_CHARS_PER_BYTE * size))
    pages: list[str] = []
    total = seen = 0  # characters: of the pages before (and breaks), of this page so far

    def visit(text: str, *_: object) -> None:
        # Called as each piece of a page's text is found: one page can hold it all.
        nonlocal seen
        seen += len(text)
        if total + seen > limit:
            raise TextTooLong(_too_long(limit))

    for page in reader.pages:
        seen = 0
        text = _clean(page.extract_text(visitor_text=visit) or "")
        if total + len(text) > limit:
            raise TextTooLong(_too_long(limit))
        pages.append(text)
        total += len(text) + 2  # and the paragraph break after it
    meta_title = reader.metadata.title if reader.metadata else None
    return Extracted("\n\n".join(p for p in pages if p), _clean(meta_title) if meta_title else None)


def _too_long(limit: int) -> str:
    return (
        f"its text runs past {limit:,} characters, the most a PDF of its size may yield "
        f"({PDF_CHARS_PER_BYTE} characters per byte, at least {MIN_PDF_TEXT_CHARS:,} and at "
        f"most {MAX_PDF_TEXT_CHARS:,}: the push API's 32 MiB body limit)"
    )
