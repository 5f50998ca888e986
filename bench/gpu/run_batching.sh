#!/usr/bin/env bash
# ON A FRESH GPU MACHINE, from the repo root, with .gpu/ carried: the issue-6 batching comparison alone.
#   bash bench/gpu/run_batching.sh RESULTS_DIR [SHAPE=7b] [QUANT=q8_0]
# Builds llama-cpp-python for sm_90 while it makes the random-weight model, converts it to GGUF, then runs our
# worker with --slots 1 and --slots 16 at concurrency 1/4/8/16 (64-word prompts, 128 output tokens, all
# layers on the GPU, no memory hold).
set -uo pipefail
R=${1:?results dir}; SHAPE=${2:-7b}; Q=${3:-q8_0}; mkdir -p "$R"
export G=/tmp/gpu
exec > >(tee -a "$R/run_batching.log") 2>&1
stamp() { echo "== [$(date +%T) +${SECONDS}s] $*"; }
stamp start; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
bash bench/gpu/install_extra.sh; python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site2 .gpu/pack/whl/*.whl > /dev/null 2>&1
(bash .gpu/setup_device.sh .gpu/pack llama > "$R/llama_build.log" 2>&1; echo $? > $G/llama_build.rc) &
BUILD=$!
python3 .gpu/make_model.py $G/models/$SHAPE --shape $SHAPE > "$R/make_model.log" 2>&1
stamp "model made"; wait $BUILD; stamp "build rc $(cat $G/llama_build.rc)"
export PYTHONPATH=$PWD:/tmp/site2:$G/src/llama_cpp_python-0.3.36 PYTHONUNBUFFERED=1
B="python3 .gpu/llamacpp_bench.py --json $R/convert.jsonl --tag llamacpp-$SHAPE"
mkdir -p $G/gguf
$B convert $G/models/$SHAPE $G/gguf/$SHAPE-f16.gguf --llama-src $G/src/llama_cpp_python-0.3.36 > "$R/convert.log" 2>&1
$B quantize $G/gguf/$SHAPE-f16.gguf $G/gguf/$SHAPE-$Q.gguf $Q >> "$R/convert.log" 2>&1
stamp "gguf ready"; ls -la $G/gguf
for slots in 1 16; do
  python3 -m backends.llamacpp.worker --model $G/gguf/$SHAPE-$Q.gguf --model-name llama2-$SHAPE --port 9100 \
    --ctx 512 --slots $slots --n-gpu-layers -1 --max-queue 256 > "$R/worker_${Q}_slots$slots.log" 2>&1 & W=$!
  for _ in $(seq 1 120); do curl -sf http://127.0.0.1:9100/health > /dev/null && break; sleep 0.5; done
  python3 -m bench.loadgen --base-url http://127.0.0.1:9100/v1 --model llama2-$SHAPE --endpoint completions \
    --prompt-tokens 64 --output-tokens 128 --concurrency 1 4 8 16 --warmup 2 \
    --label "llamacpp-$Q-slots$slots" --notes "H200 (no memory hold); random-weight Llama-2-$SHAPE shape; worker direct" \
    --output "$R/batching_${Q}_slots$slots.json" 2>&1 | tail -6
  kill -TERM $W; wait $W 2> /dev/null
done
stamp end
