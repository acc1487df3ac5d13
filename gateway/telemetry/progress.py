"""Progress of long work (ingest, reindex, sync, eval) on stderr.

On a terminal, tqdm's bar. Anywhere else (a log, a CI job, `kubectl logs`) a bar's carriage
returns are noise or nothing at all, so a plain line is printed every EVERY_S seconds with
the count, the rate and the time left, and one at the end if any was printed: a long
ingest into a log no longer looks hung after "Loading weights".
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TextIO

from tqdm import tqdm

EVERY_S = 5.0


class Progress:
    def __init__(
        self,
        total: int,
        what: str,
        unit: str,
        enabled: bool = True,
        stream: TextIO | None = None,
        every_s: float = EVERY_S,
    ) -> None:
        self.total, self.what, self.unit, self.done = total, what, unit, 0
        self._stream = stream if stream is not None else sys.stderr
        self._every_s = every_s
        terminal = enabled and self._stream.isatty()
        self._bar = tqdm(total=total, desc=what, unit=unit, file=self._stream) if terminal else None
        self._lines = enabled and not terminal
        self._started = self._said = time.monotonic()
        self._printed = False

    def update(self, n: int) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._lines and time.monotonic() - self._said >= self._every_s:
            self._say(self.line())

    def line(self) -> str:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        rate = self.done / elapsed
        units = self.unit[:-1] + "ies" if self.unit.endswith("y") else self.unit + "s"
        said = f"{self.what}: {self.done:,}/{self.total:,} {units} ({rate:,.1f}/s"
        if self.done < self.total:
            left = (self.total - self.done) / rate if rate > 0 else None
            return said + (f", about {_duration(left)} left)" if left is not None else ")")
        return said + f", {_duration(elapsed)} in all)"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._printed:  # a log that showed the work going shows it end
            self._say(self.line())

    def _say(self, line: str) -> None:
        print(line, file=self._stream, flush=True)
        self._said, self._printed = time.monotonic(), True

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
