"""No exception's message reaches a log: its type and frames do (docs/security.md,
"ID-only traces").

An exception's message can quote what a caller sent: a query parser quotes the query, a
database driver the parameters of its statement. These tests raise such exceptions with a
canary in their message and look for it in what was logged: in a record formatted by a
plain handler, and in the standard error of a real server process whose route fails,
where uvicorn logs the request's exception a second time.
"""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.bench.server import free_port
from gateway.telemetry import exceptions
from tests.helpers.documents import minimal_pdf
from tests.helpers.processes import gateway_env, run_gateway, served_env, wait_until_ready

CANARY = "canary7q3x"


def _parse(query: str) -> None:
    raise ValueError(f"cannot parse {query!r}")


def _search(query: str) -> None:
    try:
        _parse(query)
    except ValueError as exc:
        raise RuntimeError(f"search for {query} failed") from exc


def _formatted(logger: logging.Logger, log: object) -> str:
    """What a plain stream handler on `logger` prints while `log` (a callable) runs."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    try:
        log()  # type: ignore[operator]
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_a_logged_exception_keeps_its_types_and_frames_not_its_messages() -> None:
    exceptions.install()
    exceptions.install()  # a second call (the CLI, then create_app) changes nothing
    logger = logging.getLogger("uvicorn.error")  # a library's logger, not ours

    def log() -> None:
        try:
            _search(CANARY)
        except RuntimeError as exc:
            logger.error("Exception in ASGI application", exc_info=exc)
        try:
            try:
                _parse(CANARY)
            except ValueError:
                {}[CANARY]  # raised while handling the first: both are in the record
        except KeyError:
            logger.exception("failed")

    text = _formatted(logger, log)
    assert CANARY not in text
    assert "ValueError (message withheld)" in text
    assert "RuntimeError (message withheld)" in text
    assert "KeyError (message withheld)" in text
    assert "in _parse" in text and "in _search" in text  # where it was raised
    assert exceptions.CAUSE in text and exceptions.CONTEXT in text


def test_an_exception_group_is_described_with_its_members() -> None:
    try:
        _parse(CANARY)
    except ValueError as first:
        parsed = first
    group = ExceptionGroup(f"search {CANARY}", [parsed, KeyError(CANARY)])
    described = exceptions.describe(group)
    assert CANARY not in described
    assert "ExceptionGroup (message withheld)" in described
    assert "member 1 of 2" in described and "member 2 of 2" in described
    assert "ValueError (message withheld)" in described and "in _parse" in described
    assert "KeyError (message withheld)" in described


def test_a_member_raised_out_of_its_group_is_described_once() -> None:
    """`raise group.exceptions[0]` (sse-starlette's way out of a task group) makes the
    group the member's context: a cycle, which must end, not recurse until it fails."""
    try:
        try:
            raise ExceptionGroup("lanes", [ValueError(CANARY)])
        except ExceptionGroup as group:
            raise group.exceptions[0]  # noqa: B904 - as sse-starlette does
    except ValueError as exc:
        described = exceptions.describe(exc)
    assert CANARY not in described
    assert described.count("ValueError (message withheld)") == 1
    assert "ExceptionGroup (message withheld)" in described


def _failing_python(source: str) -> subprocess.CompletedProcess[str]:
    """`source` (with the canary in place of {canary}) run by a new interpreter, which
    fails, and prints the canary nowhere."""
    ran = subprocess.run(
        [sys.executable, "-c", source.format(canary=CANARY)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 1
    assert CANARY not in ran.stderr + ran.stdout
    return ran


# What Python itself prints, with no logging configured by us: asyncio's report of a task
# whose exception nobody retrieved (on asyncio's loop and on uvloop's), and exceptions no
# code caught, in a thread and in the main thread.
UNCAUGHT = """
import asyncio, gc, logging, threading, uvloop
from gateway.telemetry import exceptions

exceptions.install()
logging.basicConfig(level=logging.INFO)

async def fails():
    raise ValueError("task {canary}")

async def forgotten():
    task = asyncio.ensure_future(fails())
    await asyncio.sleep(0.01)
    del task
    gc.collect()

asyncio.run(forgotten())
uvloop.run(forgotten())

def thread_fails():
    raise ValueError("thread {canary}")

thread = threading.Thread(target=thread_fails, name="lane-7")
thread.start()
thread.join()
raise RuntimeError("main {canary}")
"""


@pytest.mark.server
def test_uncaught_exceptions_and_asyncio_reports_print_no_message() -> None:
    ran = _failing_python(UNCAUGHT)
    assert ran.stderr.count("Task exception was never retrieved (details withheld)") == 2
    assert ran.stderr.count("ValueError (message withheld)") == 3  # two tasks, the thread
    assert "Exception in thread lane-7:" in ran.stderr and "in thread_fails" in ran.stderr
    assert ran.stderr.rstrip().endswith("RuntimeError (message withheld)")


# A `gateway` command that fails on a bug: Typer's own hook would print the exception
# with its message (and Rich's rendering of it); the command's callback replaced it.
FAILING_COMMAND = """
from gateway.cli import app

@app.command("fails")
def fails() -> None:
    raise ValueError("command {canary}")

app(["fails"])
"""


@pytest.mark.server
def test_a_command_that_fails_on_a_bug_prints_no_message() -> None:
    ran = _failing_python(FAILING_COMMAND)
    assert ran.stderr.rstrip().endswith("ValueError (message withheld)")
    assert "in fails" in ran.stderr


def test_describe_names_a_library_exception_by_its_module() -> None:
    with pytest.raises(yaml.YAMLError) as raised:  # it quotes the text it could not parse
        yaml.safe_load(f"groups: [{CANARY}")
    assert CANARY in str(raised.value)
    described = exceptions.describe(raised.value)
    assert CANARY not in described
    assert "yaml.parser.ParserError (message withheld)" in described


# The served app with one more route, whose failure nothing in the product handles: the
# path of any bug in a request, through our handler and uvicorn's own log of it.
FAILING_SERVER = """
import sys
from gateway.api.app import create_app
from gateway.api.protocol import run_server
from gateway.cli.options import settings_from_env

app = create_app(settings_from_env(None))

@app.get("/fails")
def fails(q: str) -> None:
    raise ValueError(f"cannot parse {q!r}")

run_server(app, "127.0.0.1", int(sys.argv[1]))
"""


@pytest.mark.server
def test_an_unhandled_failure_in_a_served_request_logs_no_message(
    data_dir: Path, jwks_file: Path
) -> None:
    """A real uvicorn process serving the app: a request's exception quotes the query;
    the caller gets a problem+json 500, and the log has the exception's type and frames
    twice (our handler's line and uvicorn's), never its message."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", FAILING_SERVER, str(port)],
        env=served_env(data_dir, jwks_file),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_ready(process, f"{base}/readyz")
        failed = httpx.get(f"{base}/fails", params={"q": CANARY}, timeout=30)
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert process.stderr is not None
    logged = process.stderr.read().decode()
    process.stderr.close()
    assert failed.status_code == 500
    assert failed.headers["content-type"] == "application/problem+json"
    assert failed.json()["code"] == "internal_error"
    assert CANARY not in failed.text and CANARY not in logged
    assert "Exception in ASGI application" in logged  # uvicorn's own line, then ours
    assert logged.count("ValueError (message withheld)") == 2, logged
    assert logged.count("in fails") == 2


@pytest.mark.server
def test_a_pdf_whose_font_names_text_is_ingested_without_its_words_on_stderr(
    tmp_path: Path,
) -> None:
    """pypdf warns, quoting the PDF, of an encoding it does not know ("Advanced encoding
    /<name> not implemented yet"): the name is the document's to choose."""
    pdf = minimal_pdf(
        tmp_path / "manual.pdf", ["Refunds are paid in five days."], encoding="CANARY-secret-plan"
    )
    args = ["--tenant", "acme", "--region", "EU", "--acl", "group:staff"]
    args += ["--effective-from", "2026-01-01", "--data-dir", str(tmp_path / "data")]
    ran = run_gateway("ingest", str(pdf), *args, env=gateway_env())
    assert ran.returncode == 0, ran.stderr
    assert "CANARY" not in ran.stderr + ran.stdout
    assert "pypdf reported a problem (its words withheld)" in ran.stderr
