"""Which document `uri` values may be shown as links: `http(s)` URLs and relative references.

A document's `uri` comes back in search results and citations, and clients render it as a
link. A `javascript:`, `vbscript:` or `data:` link runs what the document's author wrote
in the page of whoever follows it, and `file:` and the like reach the reader's machine;
so ingest refuses every other scheme, results show a stored one as `""`, and the answer
sanitiser never keeps a link to one.

The scheme is read the way a browser reads it after a Markdown renderer: character
references decoded (`&#106;` is `j`), Markdown's backslash escapes undone (`javascript\\:`
renders as `javascript:`), case ignored, tabs and line breaks inside the value and spaces
and control characters around it dropped, so that ` JaVa&#x53;cript:` is still
`javascript:`. Spaces, control characters and escapes inside are dropped too, which only
ever refuses more.
"""

from __future__ import annotations

import functools
import html
import re

LINK_SCHEMES = frozenset({"http", "https"})
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_IGNORED = re.compile(r"[\x00-\x20\x7f]+")  # C0 controls, space and DEL
_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")  # CommonMark: a backslash before ASCII punctuation


def link_form(uri: str) -> str:
    """`uri` as a browser reads it once rendered: character references decoded, Markdown
    escapes undone (before and after decoding), spaces and control characters dropped."""
    unescaped = _ESCAPE.sub(r"\1", html.unescape(_ESCAPE.sub(r"\1", uri)))
    return _IGNORED.sub("", unescaped)


def scheme_of(uri: str) -> str | None:
    """The scheme a browser would read from `uri`, lower-cased; None for a relative
    reference (`/wiki/x`, `notes/a:b.txt`, `//host/x`, `""`)."""
    # A colon after the first '/', '?' or '#' belongs to a path, query or fragment.
    match = _SCHEME.match(link_form(uri))
    return match.group(1).lower() if match else None


def is_link_safe(uri: str) -> bool:
    """Whether `uri` is an `http(s)` URL or a relative reference."""
    scheme = scheme_of(uri)
    return scheme is None or scheme in LINK_SCHEMES


@functools.lru_cache(maxsize=4096)  # a pure function of a string; up to 100 per request
def shown_uri(uri: str) -> str:
    """`uri` as results show it: `""` for one stored before ingest refused its scheme."""
    return uri if is_link_safe(uri) else ""


def as_relative_path(path: str) -> str:
    """A file path as a safe uri: `./` first when it would read as another scheme
    (`javascript:x.txt`), as RFC 3986 (section 4.2) has a relative path whose first segment
    holds a colon written."""
    return path if is_link_safe(path) else f"./{path}"
