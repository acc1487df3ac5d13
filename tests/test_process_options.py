"""What a searching command (`gateway serve`, `demo`, `eval`) sets for its whole process:
the GIL changes hands after 0.5 ms, and numpy's BLAS runs on one thread.

Neither shows from outside a served process, and both change the process they run in, so
each test calls the function in a fresh Python process, after the imports that come
before it in `gateway serve` (the app, and with it numpy), and reads the effect there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.server

# A fresh process's view after `serve`'s set-up, or without it when `call` is "pass".
PROBE = """
import json, sys
import gateway.api.app  # what `serve` has loaded when it calls the function: numpy's BLAS
from threadpoolctl import threadpool_info
from gateway.cli.options import one_blas_thread, short_gil_turns
{call}
blas = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
print(json.dumps({{"switch_interval_s": sys.getswitchinterval(), "blas_threads": blas}}))
"""


def probe(call: str) -> dict[str, Any]:
    # BLAS is offered two threads (the test run may have set one): one after the call
    # is then the call's doing.
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(call=call)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_a_searching_process_lets_the_gil_change_hands_after_half_a_millisecond() -> None:
    assert probe("pass")["switch_interval_s"] == pytest.approx(0.005)  # Python's default
    assert probe("short_gil_turns()")["switch_interval_s"] == pytest.approx(0.0005)


def test_a_searching_process_runs_numpys_blas_on_one_thread() -> None:
    assert max(probe("pass")["blas_threads"]) == 2  # as offered, without the call
    assert set(probe("one_blas_thread()")["blas_threads"]) == {1}
