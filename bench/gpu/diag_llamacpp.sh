#!/usr/bin/env bash
# ON A FRESH GPU MACHINE, repo root, .gpu/ carried:  bash bench/gpu/diag_llamacpp.sh $OUT
# Why does our llama.cpp worker die with SIGSEGV (-11) right after "loading" on the GPU (session 3, 2026-12-01)?
# Builds llama-cpp-python for sm_90, then, with PYTHONFAULTHANDLER=1 (a Python stack at the crash):
#   T1 llama_backend_init + system info; T2 llama_cpp.Llama (llama-cpp-python's own API, verbose) on a tiny GGUF,
#   all layers on the GPU; T3 our embed worker on the bge-base-shaped BERT, GPU; T4 our generate worker, GPU;
#   T5 the same on the CPU; T6 T4 again with /tmp/gpu/env.sh (LMDeploy's LD_LIBRARY_PATH: libcudart.so.12 and
#   the cuBLAS-12 shim), which every session-3 run had and the working 2026-11-29 batching run did not.
set -uo pipefail
OUT=${1:?out dir}
exec > >(tee -a "$OUT/diag.log") 2>&1
stamp() { echo "== [$(date +%T) +${SECONDS}s] $*"; }
stamp start; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
bash bench/gpu/install_extra.sh; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site2 .gpu/pack/whl/*.whl > /dev/null 2>&1
(bash .gpu/setup_device.sh .gpu/pack lmdeploy > /tmp/setup_lmdeploy.log 2>&1) & SETUP=$!
export PYTHONPATH=$PWD:/tmp/site2:/tmp/gpu/src/llama_cpp_python-0.3.36 PYTHONFAULTHANDLER=1 PYTHONUNBUFFERED=1
python3 -m bench.gpu.bert_gguf /tmp/bert.gguf
python3 .gpu/make_model.py /tmp/tiny --shape tiny | tail -1
bash .gpu/setup_device.sh .gpu/pack llama > "$OUT/build.log" 2>&1; stamp "build rc $?"; tail -3 "$OUT/build.log"
python3 .gpu/llamacpp_bench.py convert /tmp/tiny /tmp/tiny.gguf --llama-src /tmp/gpu/src/llama_cpp_python-0.3.36 > /tmp/convert.log 2>&1
stamp "convert rc $?"; tail -2 /tmp/convert.log; ls -la /tmp/tiny.gguf

stamp T1; timeout 60 python3 -c "
import llama_cpp as l; l.llama_backend_init(); print(l.llama_print_system_info().decode())"; echo "T1 rc $?"
stamp T2; timeout 90 python3 -c "
from llama_cpp import Llama
m = Llama('/tmp/tiny.gguf', n_gpu_layers=-1, n_ctx=256, verbose=True); print(m('hello', max_tokens=4)['choices'][0])" 2>&1 | grep -v '^llama_model_loader: - \|^print_info\|^load_tensors: layer' | tail -40; echo "T2 rc ${PIPESTATUS[0]}"

worker() {  # $1 label, then worker args
  local label=$1; shift
  timeout 90 python3 -m backends.llamacpp.worker --model-name t --port 9100 --max-queue 8 "$@" > "/tmp/$label.log" 2>&1 & local w=$!
  for _ in $(seq 1 120); do curl -sf http://127.0.0.1:9100/health > /dev/null && break; kill -0 $w 2> /dev/null || break; sleep 0.5; done
  if curl -sf http://127.0.0.1:9100/health > /dev/null; then
    curl -s http://127.0.0.1:9100/health; echo
    if [[ " $* " == *" --task embed "* ]]; then
      curl -s -m 30 http://127.0.0.1:9100/v1/embeddings -H 'content-type: application/json' -d '{"model":"t","input":["the cat sat on the mat"]}' | head -c 200
    else
      curl -s -m 30 http://127.0.0.1:9100/v1/completions -H 'content-type: application/json' -d '{"model":"t","prompt":"hello","max_tokens":4}' | head -c 300
    fi
    echo; kill -TERM $w
  fi
  wait $w; echo "$label worker rc $?"
  grep -v '^\s*$' "/tmp/$label.log" | tail -40
}
stamp T3; worker T3 --task embed --model /tmp/bert.gguf --ctx 512 --slots 8 --n-gpu-layers -1
stamp T4; worker T4 --model /tmp/tiny.gguf --ctx 256 --slots 2 --n-gpu-layers -1
stamp T5; worker T5 --model /tmp/tiny.gguf --ctx 256 --slots 2 --n-gpu-layers 0
wait $SETUP; stamp "lmdeploy setup: $(tail -1 /tmp/setup_lmdeploy.log)"
stamp T6; ( source /tmp/gpu/env.sh; echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; export PYTHONPATH=$PWD:/tmp/site2:$PYTHONPATH
  worker T6 --model /tmp/tiny.gguf --ctx 256 --slots 2 --n-gpu-layers -1 )
stamp T7; ( source /tmp/gpu/env.sh; export PYTHONPATH=$PWD:/tmp/site2:$PYTHONPATH
  timeout 60 python3 -c "
import llama_cpp as l; l.llama_backend_init(); print(l.llama_print_system_info().decode())"; echo "T7 rc $?" )
stamp end
