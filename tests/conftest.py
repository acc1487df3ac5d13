"""Shared fixtures: the real model, a real corpus ingested into real engines, a real issuer."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import tests.helpers.properties  # noqa: F401  registers the `check` profile before collection
from tests.helpers.identity import AUDIENCE, ISSUER, TokenFactory, make_settings

# The fixtures import the product where they need it: pytest-xdist's controller loads this
# file for its hooks only, and 1.3 s of imports there would delay the workers' start.
if TYPE_CHECKING:
    from fastapi.testclient import TestClient

    from gateway.authn.devkeys import SigningKey
    from gateway.embedding import Embedder
    from gateway.storage.layout import DataLayout
    from tests.helpers.postgres import Cluster
    from tests.helpers.scim import Scim
    from tests.helpers.seaweed import S3Store

OWN_ENVIRONMENT = ("GATEWAY_", "OTEL_")


@pytest.fixture(scope="session", autouse=True)
def _no_developer_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Tests see the settings they make, not the GATEWAY_* or OTEL_* variables of the shell
    that runs them (a developer's data dir or issuer would change what they test).

    One setting is the run's own: every app and `gateway` process of the run keeps the
    query encoder's ONNX export in one cache, as the servers of one deployment may, instead
    of exporting it again (seconds of torch) for each fresh data dir. A test about the
    export names its own directory."""
    with pytest.MonkeyPatch.context() as patch:
        for name in list(os.environ):
            if name.startswith(OWN_ENVIRONMENT):
                patch.delenv(name)
        patch.setenv("GATEWAY_MODEL_CACHE_DIR", str(_run_model_cache(tmp_path_factory)))
        yield


def _run_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory shared by the run's pytest-xdist workers (their base temp directories
    are siblings), or the single process's own."""
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "model-cache"
    shared.mkdir(exist_ok=True)
    return shared


# What `-m "not slow"` leaves out: tests that load the embedding model, start a process,
# wait on real time, or need an LLM endpoint. `make check` runs the rest in under 30 s, and
# the guards below fail a test that does any of these without its marker.
SLOW_MARKERS = ("model", "server", "sleeps", "llm")
MODEL_FIXTURES = {"embedder"}  # every model load in the tests goes through these
SERVER_FIXTURES = {"postgres", "s3"}  # fixtures that start server processes


@pytest.fixture(autouse=True)
def _interpreter_as_found() -> Iterator[None]:
    """A command run in process (`gateway eval` through CliRunner) sets the GIL's switch
    interval for searching (`short_gil_turns`): the next test gets Python's own again."""
    interval = sys.getswitchinterval()
    yield
    sys.setswitchinterval(interval)


@pytest.fixture(autouse=True)
def _model_loads_only_where_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    """Keeps the markers true: a test that loads the model (torch, or sentence-transformers
    for a cross-encoder) without the `model` marker fails, so `-m "not slow"` stays fast."""
    loaded = "torch" in sys.modules
    yield
    loaded_here = not loaded and "torch" in sys.modules
    if loaded_here and request.node.get_closest_marker("model") is None:
        pytest.fail("this test loads the embedding model: mark it `model`")


@pytest.fixture(autouse=True)
def _processes_and_sleeps_only_where_marked(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """The other two ways a fast test turns slow: starting a process (a `gateway` command, a
    database) fails at once without the `server` marker, and sleeping in the test's own
    thread fails at the end without `sleeps` (or `server`): await a condition instead.
    Threads the test starts may sleep (a writer's poll), which costs the test nothing."""
    if request.node.get_closest_marker("slow") is not None:
        yield
        return
    real_sleep = time.sleep
    test_thread = threading.get_ident()
    slept: list[float] = []

    def refuse_process(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        pytest.fail("this test starts a process: mark it `server`")

    def note_sleep(seconds: float) -> None:
        if seconds > 0 and threading.get_ident() == test_thread:
            slept.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse_process)
    monkeypatch.setattr(time, "sleep", note_sleep)
    yield
    if slept:
        pytest.fail(f"this test sleeps {sum(slept):.2f} s: await a condition or mark it `sleeps`")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.model)
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.server)
        if any(item.get_closest_marker(name) for name in SLOW_MARKERS):
            item.add_marker(pytest.mark.slow)
    # The modules with tests marked `long` first, then those that start the most processes,
    # each module's own order kept: under pytest-xdist (`make test`, which keeps this
    # order) the longest modules start early and the short ones fill in around them,
    # instead of one long module running alone at the end.
    long = Counter(item.module.__name__ for item in items if _marked(item, "long"))
    starts = Counter(item.module.__name__ for item in items if _marked(item, "server"))
    items.sort(key=lambda item: (not long[item.module.__name__], -starts[item.module.__name__]))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Python's cyclic collector walks every tracked object of a generation it collects;
    a test process holds torch, the engines, FastAPI and Hypothesis, and at the default
    thresholds (700, 10, 10) collecting took a tenth of its CPU (measured with
    `gc.callbacks` over seven in-process modules: 3.7 of 41 CPU-s). What is loaded by now
    lives as long as the process, so it is set aside (`gc.freeze`), and collections come
    rarer: 1.4 CPU-s then. A served app freezes what its start made too (`create_app`'s
    `freeze_startup`), but keeps Python's thresholds."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)


# Modules that share a costly session fixture run on one pytest-xdist worker, one after
# another, instead of each worker that draws one starting it again: sentence-transformers
# (4-5 s of imports, and the cross-encoder built once per process) and the S3 store
# (a SeaweedFS process, 4 CPU-s over a run).
SHARED_SCOPES = {
    **dict.fromkeys(
        ("test_embedding_precision", "test_policy_reload", "test_query_encoder", "test_rerank"),
        "sentence-transformers",
    ),
    **dict.fromkeys(
        ("test_object_store", "test_replicas", "test_erasure_replicas", "test_lexical_rows",
         "test_object_keys"),
        "s3",
    ),
}  # fmt: skip


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadscope` (make test), with the modules above grouped by what they share."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return SHARED_SCOPES.get(Path(scope.split("::", 1)[0]).stem, scope)

    return Scheduling(config, log)


def _marked(item: pytest.Item, name: str) -> bool:
    return isinstance(item, pytest.Function) and item.get_closest_marker(name) is not None


@pytest.fixture
def reap() -> Iterator[Callable[[subprocess.Popen[bytes]], subprocess.Popen[bytes]]]:
    """Registers a process the test starts; one still running at teardown is killed, so
    that a failed assertion does not leave it running into later tests."""
    started: list[subprocess.Popen[bytes]] = []

    def register(process: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        started.append(process)
        return process

    yield register
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Cluster]:
    """A PostgreSQL cluster of the test session's own; each test makes its databases."""
    from tests.helpers.postgres import throwaway_cluster

    with throwaway_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Store]:
    """An S3-compatible store of the test session's own; each test takes a prefix."""
    from tests.helpers.seaweed import throwaway_store

    with throwaway_store() as store:
        yield store


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    from gateway.embedding import Embedder

    return Embedder()


@pytest.fixture(scope="session")
def cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Path:
    """A cross-encoder built from the packaged model's weights (untrained head, fixed seed):
    a real model directory to load offline, shared by the rerank and reload tests."""
    import torch
    from sentence_transformers import CrossEncoder

    torch.manual_seed(7)
    target = tmp_path_factory.mktemp("cross-encoder")
    CrossEncoder(str(embedder.model_dir), num_labels=1, device="cpu").save(str(target))
    return target


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.helpers.documents import write_corpus

    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def data_dir(
    tmp_path_factory: pytest.TempPathFactory, corpus_dir: Path, embedder: Embedder
) -> Path:
    from gateway.ingest.pipeline import ingest_paths
    from gateway.storage.layout import DataLayout

    root = tmp_path_factory.mktemp("data")
    ingest_paths([corpus_dir], DataLayout(root), embedder)
    return root


@pytest.fixture(scope="session")
def signing_key() -> SigningKey:
    from gateway.authn.devkeys import generate_signing_key

    return generate_signing_key("RS256", kid="test-key-1")


@pytest.fixture(scope="session")
def jwks_file(tmp_path_factory: pytest.TempPathFactory, signing_key: SigningKey) -> Path:
    from gateway.authn.devkeys import write_jwks

    path = tmp_path_factory.mktemp("issuer") / "jwks.json"
    write_jwks(path, signing_key.public_jwks())
    return path


@pytest.fixture(scope="session")
def make_token(signing_key: SigningKey) -> TokenFactory:
    def _make(
        sub: str = "alice",
        tenant: str | None = "acme",
        region: str | None = "EU",
        groups: list[str] | None = None,
        ttl: int = 300,
        **extra: Any,
    ) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": sub,
            "iat": now,
            "exp": now + ttl,
            "groups": groups if groups is not None else ["staff"],
        }
        if tenant is not None:
            claims["tenant"] = tenant
        if region is not None:
            claims["region"] = region
        claims.update(extra)
        return signing_key.sign(claims)

    return _make


@pytest.fixture(scope="session")
def client(data_dir: Path, jwks_file: Path, embedder: Embedder) -> Iterator[TestClient]:
    from fastapi.testclient import TestClient

    from gateway.api.app import create_app

    app = create_app(make_settings(data_dir, jwks_file), embedder=embedder)
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def app(
    tmp_path_factory: pytest.TempPathFactory, data_dir: Path, jwks_file: Path, embedder: Embedder
) -> Iterator[tuple[TestClient, DataLayout]]:
    """An in-process app with a directory of its own: one per test module, for the
    modules that provision by SCIM (a module may define its own `app`)."""
    from tests.helpers.scim import scim_app

    with scim_app(tmp_path_factory, data_dir, jwks_file, embedder) as served:
        yield served


@pytest.fixture
def acme(app: tuple[TestClient, DataLayout]) -> Scim:
    """A SCIM client of tenant acme on the module's `app`."""
    from tests.helpers.scim import Scim, scim_key

    return Scim(app[0], scim_key(app[1], "acme"))
