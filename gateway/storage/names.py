"""How a generation's directories and objects are named: `g` and its number, six digits
wide (more past a million), as `g000042`; a copy still being written ends `.partial`."""

from __future__ import annotations

PARTIAL = ".partial"


def generation_name(number: int) -> str:
    return f"g{number:06d}"


def generation_number(name: str, partial: bool = False) -> int | None:
    """The number that `name` gives a generation; None for any other name. A copy being
    written (`g000042.partial`) counts only when `partial`. ASCII digits only: `int()`
    would also read other scripts' digits, which no name of ours holds."""
    if partial:
        name = name.removesuffix(PARTIAL)
    digits = name[1:]
    if not name.startswith("g") or not (digits.isascii() and digits.isdigit()):
        return None
    return int(digits)
