"""Why passages are embedded as they are, said where an operator looks: at the start of
every process that embeds them (`gateway worker`, both modes; `gateway ingest`, `gateway
reindex`; `gateway serve`), and as a warning when bfloat16 is forced on a CPU that only
emulates it (docs/operations.md, "Embedding precision"). A writer on an index of another
model refuses at start, as an embedder does (invariant 12)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from sqlalchemy import text

from gateway.bench.server import free_port, gateway_command
from gateway.embedding import Embedder
from gateway.embedding.precision import BF16_FLAGS, choose, cpu_flags
from tests.helpers.documents import seed, write_corpus
from tests.helpers.policies import write_policy
from tests.helpers.processes import (
    gateway_env,
    logged_command,
    run_gateway,
    served_env,
    wait_for_line,
    wait_until_ready,
)

FORCED = "set: GATEWAY_EMBEDDING_PRECISION=bfloat16"
EMULATED = "emulated: this CPU lacks amx_bf16/avx512_bf16; several times slower than float32"
NATIVE = bool(BF16_FLAGS & cpu_flags())  # this machine's CPU, whichever it is
# What forcing bfloat16 says here: emulated on a CPU without native bfloat16.
FORCED_HERE = FORCED if NATIVE else f"{FORCED} ({EMULATED})"


def test_forcing_bfloat16_is_accepted_and_says_when_the_cpu_only_emulates_it() -> None:
    emulated = choose("bfloat16", frozenset({"avx2", "fma", "avx512_vnni"}), cuda=False)
    assert (emulated.label, emulated.reason, emulated.emulated) == (
        "bfloat16",
        f"{FORCED} ({EMULATED})",
        True,
    )
    for flags in ({"avx512_bf16"}, {"amx_bf16", "amx_tile"}):
        native = choose("bfloat16", frozenset(flags), cuda=False)
        assert (native.label, native.reason, native.emulated) == ("bfloat16", FORCED, False)
    assert not choose("bfloat16", frozenset(), cuda=True).emulated  # a GPU's own numerics
    assert not choose("float32", frozenset(), cuda=False).emulated
    here = choose("bfloat16", cuda=False)  # the flags this CPU reports
    assert (here.reason, here.emulated) == (FORCED_HERE, not NATIVE)


@pytest.mark.model
@pytest.mark.server
def test_ingest_and_reindex_say_the_numerics_and_why_on_standard_error(tmp_path: Path) -> None:
    env = gateway_env(
        GATEWAY_DATA_DIR=str(tmp_path / "data"),
        GATEWAY_POLICY_DIR=str(write_policy(tmp_path / "policy")),
        GATEWAY_EMBEDDING_PRECISION="bfloat16",
    )
    ingested = run_gateway("ingest", str(write_corpus(tmp_path / "corpus")), env=env)
    assert ingested.returncode == 0, ingested.stderr
    warning = "" if NATIVE else "warning: "
    assert f"{warning}passages are embedded in bfloat16 ({FORCED_HERE})\n" in ingested.stderr
    assert "passages are embedded" not in ingested.stdout  # stdout keeps the report alone

    reindexed = run_gateway("reindex", env={**env, "GATEWAY_EMBEDDING_PRECISION": "float32"})
    assert reindexed.returncode == 0, reindexed.stderr
    assert (
        "passages are embedded in float32 (set: GATEWAY_EMBEDDING_PRECISION=float32)\n"
        in reindexed.stderr
    )


@pytest.mark.model
@pytest.mark.server
@pytest.mark.parametrize("mode", [[], ["--embed-only"]], ids=["writer", "embed-only"])
def test_a_worker_logs_the_numerics_and_why_before_it_is_ready(
    tmp_path: Path, embedder: Embedder, mode: list[str]
) -> None:
    layout = seed(tmp_path, embedder)
    env = gateway_env(
        GATEWAY_DATA_DIR=str(layout.root),
        GATEWAY_POLICY_DIR=str(write_policy(tmp_path / "policy")),
        GATEWAY_EMBEDDING_PRECISION="bfloat16",
    )
    log = tmp_path / "worker.log"
    with logged_command(["worker", *mode], env, log) as process:
        wait_for_line(log, process, "writer ready" if not mode else "embedder ready")
    logged = log.read_text()
    level = "INFO" if NATIVE else "WARNING"
    line = f"{level} gateway.worker passages are embedded in bfloat16 ({FORCED_HERE})\n"
    assert line in logged, logged
    assert logged.index(line) < logged.index(" ready")


@pytest.mark.model
@pytest.mark.server
def test_the_server_logs_the_numerics_and_why_on_standard_error(
    data_dir: Path, jwks_file: Path, tmp_path: Path
) -> None:
    """Its line went to a logger that uvicorn's logging gave no handler: dropped."""
    port = free_port()
    log = tmp_path / "serve.log"
    env = served_env(data_dir, jwks_file, GATEWAY_EMBEDDING_PRECISION="float32")
    command = [gateway_command(), "serve", "--no-worker", "--host", "127.0.0.1"]
    with log.open("wb") as err:
        process = subprocess.Popen(
            [*command, "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=err
        )
        try:
            wait_until_ready(process, f"http://127.0.0.1:{port}/readyz")
        finally:
            process.terminate()
            process.wait(timeout=30)
    logged = log.read_text()
    line = "INFO:     passages are embedded in float32 (set: GATEWAY_EMBEDDING_PRECISION=float32)"
    assert line in logged, logged


@pytest.mark.model
@pytest.mark.server
def test_a_writer_on_an_index_of_another_model_refuses_at_start(
    tmp_path: Path, embedder: Embedder
) -> None:
    """It said `writer ready` and then failed each queued job with index_mismatch, after
    embedding it whole."""
    layout = seed(tmp_path, embedder)
    with layout.open_catalog().engine.begin() as connection:
        connection.execute(text("UPDATE generations SET model_name = 'other/model', dim = 768"))
    env = gateway_env(
        GATEWAY_DATA_DIR=str(layout.root),
        GATEWAY_POLICY_DIR=str(write_policy(tmp_path / "policy")),
    )
    result = subprocess.run(
        [gateway_command(), "worker"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1, result.stderr
    assert "writer ready" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("index_mismatch: index generation ") and "other/model" in last
    assert "gateway reindex" in last and "Traceback" not in result.stderr
