# The README and CI call these targets; nothing needed at run time is produced only here.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install inspector idp test check lint demo openapi schema clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned to the CPU build, or pip pulls a CUDA build of several GB.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# The LLM tests' endpoint (pyproject's llmtest extra); only the tests need it, not the demo.
# llama.cpp is built for a generic x86-64 with AVX2, not -march=native: on CPUs with AMX
# and AVX-512 the native build crashed (SIGSEGV) on every batched prompt.
$(VENV)/.installed-llmtest: $(VENV)/.installed
	CMAKE_ARGS="-DGGML_NATIVE=OFF" $(BIN)/pip install -q -e '.[dev,llmtest]'
	touch $@

# The MCP Inspector's CLI, which tests/test_mcp_inspector.py runs: from the lockfile, with
# no install scripts (none is needed to run the CLI). Only this step needs the npm registry.
INSPECTOR := tests/mcp_inspector/node_modules/.package-lock.json
$(INSPECTOR): tests/mcp_inspector/package-lock.json
	npm ci --prefix tests/mcp_inspector --ignore-scripts --no-audit --no-fund

inspector: $(INSPECTOR)

# The OpenID provider the identity tests sign in with (npm oidc-provider, configured by
# tests/idp/provider.mjs): from the lockfile, with no install scripts (none is needed).
IDP := tests/idp/node_modules/.package-lock.json
$(IDP): tests/idp/package-lock.json
	npm ci --prefix tests/idp --ignore-scripts --no-audit --no-fund

idp: $(IDP)

# The full suite, as CI runs it: pytest-xdist workers, each test module on one worker so
# that its module fixtures start once; the modules that start processes go first
# (tests/conftest.py) so that none of them is left running alone at the end.
# Every process of the run computes on one OpenMP thread: the workers and the servers,
# writers and embedders they start share the cores, and torch's default of a thread per
# core in each of them spent about 200 of the run's 900 CPU seconds waiting on the others
# (two cores: 443 s with torch's default, 400 s with one thread). One worker more than the
# cores keeps them busy while others wait on processes (356 s at three workers, 371 s at
# four). Two workers on two cores can push an in-process app's lane past its budget (300 ms
# for BM25) while another starts servers: such a test (503 lanes_unavailable) runs once
# more, and only such a test; any other failure fails the run at once.
# Bytecode caches are written even where the shell sets PYTHONDONTWRITEBYTECODE (these
# machines do): otherwise each of the run's ~110 processes compiles the package again and
# each pytest process rewrites the asserts of every test module again (4 s of its 7.5 s
# of collection here).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 < 6 ? $$(nproc) + 1 : 6 )))
test: lint $(VENV)/.installed-llmtest $(INSPECTOR) $(IDP)
	PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=1 $(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadscope \
		--no-loadscope-reorder --reruns 1 --only-rerun lanes_unavailable

# The fast loop: lint, types and every test that needs no model, no server and no LLM
# (pytest markers, set in tests/conftest.py). Under 30 s; `make test` stays the real gate.
check: lint
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -q -m "not slow" --hypothesis-profile=check

lint: install
	$(BIN)/ruff check gateway tests scripts
	$(BIN)/ruff format --check gateway tests scripts
	$(BIN)/mypy

demo: install
	$(BIN)/gateway demo

# The checked-in API description; tests/test_openapi.py fails when it drifts from the app.
openapi: install
	$(BIN)/python -m gateway.api.openapi > openapi.yaml

# The policy files' JSON schema; tests/test_policy_loader.py fails when it drifts.
schema: install
	$(BIN)/gateway policy schema > policies/schema.json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
