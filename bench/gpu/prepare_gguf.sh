#!/usr/bin/env bash
# ON THE GPU MACHINE (started in the background by run_turbomind.sh): wait for the llama-cpp-python CUDA build,
# then convert the random-weight 7B model to GGUF F16 and quantize it to Q8_0 and Q4_K_M under /tmp/gpu/gguf.
set -uo pipefail
export G=/tmp/gpu
while [[ ! -f $G/llama_build.rc ]]; do sleep 5; done
[[ $(cat $G/llama_build.rc) == 0 ]] || { echo "llama build failed"; exit 1; }
source $G/env.sh
mkdir -p $G/gguf
B="python3 .gpu/llamacpp_bench.py --json $G/gguf/convert.jsonl --tag llamacpp-7b"
[[ -f $G/gguf/7b-f16.gguf ]] || $B convert $G/models/7b $G/gguf/7b-f16.gguf.tmp --llama-src $G/src/llama_cpp_python-0.3.36 && mv $G/gguf/7b-f16.gguf.tmp $G/gguf/7b-f16.gguf
for q in ${GGUF_QUANTS:-q8_0 q4_k_m}; do  # GGUF_QUANTS: a shorter list when time is short
  [[ -f $G/gguf/7b-$q.gguf ]] || { $B quantize $G/gguf/7b-f16.gguf $G/gguf/7b-$q.gguf.tmp $q && mv $G/gguf/7b-$q.gguf.tmp $G/gguf/7b-$q.gguf; }
done
echo done > $G/gguf/ready
