#!/usr/bin/env bash
# ON THE GPU MACHINE (called by run_session3.sh's smoke step, env.sh sourced): is it our llama.cpp log callback
# that crashes the worker's model load (SIGSEGV, 2026-12-01)? $1 = a small GGUF.  One line per variant.
# Session-4 findings so far: every bench.gpu.diag_threads variant loads (main thread or not, our forwarder on);
# the worker crashes (also on its main thread, also with CUDA hidden, with asyncio or uvloop); the worker
# with our forwarder never installed (llama-cpp-python's own callback left in place) loads and serves.
T=${1:?gguf}
export PYTHONFAULTHANDLER=1 PYTHONUNBUFFERED=1
LOAD="
import pathlib; m = native.Model(pathlib.Path('$T'), native.ContextOptions(n_ctx_per_seq=256, n_seq_max=2, n_gpu_layers=-1)); print('loaded', flush=True)"
v() { local name=$1; shift; timeout 60 python3 -c "$@" > /tmp/diag_logs.out 2>&1; local rc=$?
  echo "== $name: rc $rc $(grep -c . /tmp/diag_logs.out) lines; $(grep -m1 -o 'loaded$\|Segmentation fault\|Error.*' /tmp/diag_logs.out)"; }
v trivial-lambda-callback "import ctypes; from backends.llamacpp import native, worker
cb = native.lib.llama_log_callback(lambda l, t, u: None); native.lib.llama_log_set(cb, ctypes.c_void_p(0)); native.lib.llama_backend_init(); native._log_forwarder = object()
$LOAD"
for mode in forward plain library stderr; do
  VOLTGATE_LLAMACPP_LOG=$mode v "import-worker-mode-$mode" "from backends.llamacpp import native, worker
$LOAD"
done
VOLTGATE_LLAMACPP_LOG=forward v import-native-only-forward "from backends.llamacpp import native
$LOAD"
VOLTGATE_LLAMACPP_LOG=forward v import-embedding-forward "from backends.llamacpp import native, embedding
$LOAD"
VOLTGATE_LLAMACPP_LOG=forward v import-pydantic-forward "import pydantic; from backends.llamacpp import native
$LOAD"
VOLTGATE_LLAMACPP_LOG=forward v import-uvicorn-forward "import uvicorn; from backends.llamacpp import native
$LOAD"
VOLTGATE_LLAMACPP_LOG=forward v import-worker-gc-off-forward "import gc; gc.disable(); from backends.llamacpp import native, worker
$LOAD"
