"""What the lexical analysis treats as an identifier, and that user syntax is inert."""

from __future__ import annotations

import pytest

from gateway.storage.lexical import LexicalIndex


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> LexicalIndex:
    return LexicalIndex(tmp_path_factory.mktemp("lex"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("What does RPL-14 say?", ["rpl-14"]),
        ("CVE-2024-3094 and INV-00042.", ["cve-2024-3094", "inv-00042"]),
        ("paper size A4 on 2024-01-01", ["a4", "2024-01-01"]),
        ("in 1973 the e-mail rule", []),  # plain numbers and words are prose
        ("title:(a acl:x *", []),
    ],
)
def test_identifiers(index: LexicalIndex, text: str, expected: list[str]) -> None:
    assert index.identifiers(text) == expected
