"""An HTML page's text is what a reader of the page sees: no comments or declarations,
words that inline elements run through kept whole, and a section's own header."""

from __future__ import annotations

from gateway.ingest.formats import extract_html


def paragraphs(page: bytes) -> list[str]:
    return extract_html(page).text.split("\n\n")


def test_comments_declarations_and_instructions_are_no_text() -> None:
    """`find_all(string=True)` returned comments too: a note left for the page's editors
    was stored, and found, as a paragraph of the document."""
    page = b"""<!DOCTYPE html><?xml-stylesheet href="a.css"?><html><body>
    <!-- TODO remove: layoffs planned for Q3 --><p>Hours<!-- was: 9-5 --> are 8-4.</p>
    <![CDATA[ draft ]]><p>Lunch at noon.</p></body></html>"""
    assert paragraphs(page) == ["Hours are 8-4.", "Lunch at noon."]


def test_inline_elements_do_not_split_words() -> None:
    """The strings were joined with spaces: `un<b>believ</b>able` read `un believ able`."""
    page = b"""<html><body><p>un<b>believ</b>able, see <a href="/d">the docs</a>.</p>
    <p>H<sub>2</sub>O and E=mc<sup>2</sup>; <code>git</code>'s <em>own</em> rule</p>
    <p>line one<br>line two</p><div><figure>Fig</figure><figure>ures</figure></div>
    <table><tr><td>cell</td><td>next</td></tr></table></body></html>"""
    assert paragraphs(page) == [
        "unbelievable, see the docs.",
        "H2O and E=mc2; git's own rule",
        "line one line two",
        "Fig ures",
        "cell",
        "next",
    ]


def test_a_sections_header_and_footer_are_kept_the_pages_dropped() -> None:
    """Every header and footer was dropped: an article's heading with them."""
    page = b"""<html><head><title>Board</title></head><body><div id="page">
    <header><a href="/">Intranet home</a></header><main><article><header><h1>Agenda</h1>
    <p>Monday</p></header><p>Budget review.</p><footer>Minutes by Ann</footer></article>
    <section><header><h2>Next</h2></header><p>Hiring.</p></section></main>
    <footer>(c) 2026 Intranet</footer></div></body></html>"""
    assert paragraphs(page) == [
        "# Agenda",
        "Monday",
        "Budget review.",
        "Minutes by Ann",
        "## Next",
        "Hiring.",
    ]
