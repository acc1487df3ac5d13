"""Links and images in LLM output lose any target that is not the evidence's own uri."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

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


PIECES = st.sampled_from(
    [
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
