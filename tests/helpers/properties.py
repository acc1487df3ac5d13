"""How hard the property tests try: the number of examples each names under `make test`, and
a fifth of it under `make check` (Hypothesis profile `check`), so the fast loop stays fast
and the full suite keeps its power."""

from __future__ import annotations

from hypothesis import settings

FULL = 100  # Hypothesis' own default, which `make test` keeps
settings.register_profile("check", max_examples=FULL // 5)


def examples(full: int) -> int:
    """`full` under the default profile; scaled with the loaded profile otherwise."""
    loaded = settings.default.max_examples
    return full if loaded >= FULL else max(5, full * loaded // FULL)
