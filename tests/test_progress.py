"""Long work's progress: a plain line with rate and time left where output is not a
terminal (a log), nothing when disabled."""

from __future__ import annotations

import io
import re

from gateway.telemetry.progress import Progress


def test_a_log_gets_plain_lines_with_rate_and_time_left_then_the_total() -> None:
    log = io.StringIO()
    with Progress(1000, "embedding", "chunk", stream=log, every_s=0.0) as shown:
        shown.update(250)
        shown.update(250)
    lines = log.getvalue().splitlines()
    assert re.fullmatch(r"embedding: 250/1,000 chunks \([\d,.]+/s, about \d+ s left\)", lines[0])
    assert lines[1].startswith("embedding: 500/1,000 chunks")
    assert re.fullmatch(r"embedding: 500/1,000 chunks \([\d,.]+/s, about \d+ s left\)", lines[-1])
    assert "\r" not in log.getvalue()  # no bar redrawn in a log


def test_short_work_and_disabled_progress_print_nothing() -> None:
    quiet, off = io.StringIO(), io.StringIO()
    with Progress(10, "sync", "doc", stream=quiet) as shown:  # done before the first line
        shown.update(10)
    with Progress(10, "sync", "doc", stream=off, enabled=False, every_s=0.0) as shown:
        shown.update(10)
    assert quiet.getvalue() == "" and off.getvalue() == ""


def test_finished_work_says_how_long_it_took() -> None:
    log = io.StringIO()
    with Progress(3, "sync", "doc", stream=log, every_s=0.0) as shown:
        shown.update(3)
    assert re.fullmatch(
        r"sync: 3/3 docs \([\d,.]+/s, 0 s in all\)", log.getvalue().splitlines()[-1]
    )
