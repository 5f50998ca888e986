#!/usr/bin/env bash
# ON THE GPU MACHINE (env.sh sourced): does the order of importing numpy and llama_cpp decide the SIGSEGV in
# llama_model_load_from_file (2026-12-01)?  $1 = a small GGUF.  One line per variant.
T=${1:?gguf}
export PYTHONFAULTHANDLER=1 PYTHONUNBUFFERED=1
v() { local name=$1; shift; timeout 60 python3 -c "$@" > /tmp/order.out 2>&1; echo "== $name: rc $? $(grep -m1 -o 'loaded.*\|Segmentation fault' /tmp/order.out)"; }
L="
import pathlib; m = native.Model(pathlib.Path('$T'), native.ContextOptions(n_ctx_per_seq=256, n_seq_max=2, n_gpu_layers=-1)); print('loaded', flush=True)"
v numpy-then-llama_cpp "import numpy; from backends.llamacpp.worker import native$L"
v llama_cpp-then-numpy "import llama_cpp; import numpy; from backends.llamacpp.worker import native$L"
v starlette-then-llama_cpp "import starlette.applications; from backends.llamacpp.worker import native$L"
v worker-module "from backends.llamacpp import worker, native$L"
python3 -c "import numpy; print('numpy', numpy.__version__, numpy.__file__)"
ldd "$(python3 -c 'import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))')/lib/libggml-cpu.so" | grep -i "omp\|blas"
