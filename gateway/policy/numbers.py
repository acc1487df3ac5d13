"""Numbers of a policy: numbers as YAML writes them, never a boolean or a text.

Pydantic's default would take `true` (YAML also reads yes and on so) as 1 and the text
"300" as 300, so a policy could mean a number its reader does not see. A whole number
still serves where a fraction is allowed, and `96.0` where a whole number is asked (as
before): only booleans and texts are refused. NaN and infinities are refused by the
models' `allow_inf_nan=False`."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator


def _a_number(value: object) -> object:
    if isinstance(value, bool | str):
        raise ValueError("must be a number, written as one (not true/false, not quoted)")
    return value


NUMBER_ONLY = BeforeValidator(_a_number)
Number = Annotated[float, NUMBER_ONLY]
Whole = Annotated[int, NUMBER_ONLY]
# An optional bounded whole number puts its bounds before NUMBER_ONLY (`Annotated[int,
# Field(ge=1), NUMBER_ONLY] | None`): after it, the JSON schema names them `ge`/`le`
# instead of `minimum`/`maximum`.
