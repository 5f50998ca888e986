#!/usr/bin/env bash
# ON THE GPU MACHINE (2x H200 kind), from the repo root, with .gpu/ (pack + extra wheels) carried:
#   bash bench/gpu/run_turbomind.sh RESULTS_DIR
# 1. installs LMDeploy 0.18 (TurboMind, sm_90 pack from ../shared/gpu) and starts the llama.cpp CUDA build in
#    the background (for run_llamacpp.sh), 2. makes the random-weight Llama-2-7B-shaped model,
# 3. holds the H200's memory to a V100-32GB's (32,510 MiB free), runs `voltgate plan` and `voltgate serve`
#    (the plan sends the model to TurboMind FP16), the SDK smoke scenarios and the load sweep through the gateway,
#    (SMOKE_ONLY=1 skips the load sweep; GGUF=0 skips the background GGUF preparation)
# 4. holds both GPUs to 16,160 MiB free (2x V100-16GB) and does the same with the plan's tensor parallelism.
set -uo pipefail
R=${1:?results dir}; mkdir -p "$R"
export G=/tmp/gpu
exec > >(tee -a "$R/run_turbomind.log") 2>&1
stamp() { echo "== [$(date +%T) +${SECONDS}s] $*"; }
stamp start; nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv,noheader

[[ -f $G/env.sh ]] || bash .gpu/setup_device.sh .gpu/pack lmdeploy > "$R/setup_lmdeploy.log" 2>&1 || { stamp "setup failed"; tail -30 "$R/setup_lmdeploy.log"; exit 1; }
if [[ ${GGUF:-1} == 1 && ! -f $G/llama_build.rc ]] && ! pgrep -f "setup_device.sh .gpu/pack llama" > /dev/null; then
  setsid nohup nice -n 10 bash -c "bash .gpu/setup_device.sh .gpu/pack llama > $G/llama_build.log 2>&1; echo \$? > $G/llama_build.rc" > /dev/null 2>&1 &
fi
source "$G/env.sh"
bash bench/gpu/install_extra.sh
export PYTHONPATH=$PWD:/tmp/site2:$PYTHONPATH PYTHONUNBUFFERED=1
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m lmdeploy "$@"\n' > /tmp/bin/lmdeploy && chmod +x /tmp/bin/lmdeploy
export PATH=/tmp/bin:$PATH
python3 -c "import lmdeploy, gateway, backends; print('lmdeploy', lmdeploy.__version__)"

[[ -f $G/models/7b/config.json ]] || { stamp "make model 7b"; python3 .gpu/make_model.py $G/models/7b --shape 7b > "$R/make_model.log" 2>&1; }
stamp "model ready"
# GGUF conversion waits for the llama.cpp build, in the background, for run_llamacpp.sh.
[[ ${GGUF:-1} == 0 || -f $G/gguf/ready ]] || pgrep -f prepare_gguf.sh > /dev/null || setsid nohup nice -n 5 bash bench/gpu/prepare_gguf.sh > $G/prepare_gguf.log 2>&1 < /dev/null &

serve_and_test() {  # $1 = label, $2 = --gpus layout, $3 = concurrency list
  local label=$1 gpus=$2
  python3 -m gateway plan --config bench/gpu/configs/tm-7b.yaml --gpus "$gpus" > "$R/plan_$label.txt" 2>&1
  python3 -m gateway plan --config bench/gpu/configs/tm-7b.yaml --gpus "$gpus" --json > "$R/plan_$label.json" 2>&1
  cat "$R/plan_$label.txt"
  python3 -m gateway serve --config bench/gpu/configs/tm-7b.yaml --gpus "$gpus" > "$R/gateway_$label.log" 2>&1 &
  local gw=$!
  for _ in $(seq 1 400); do
    curl -sf http://127.0.0.1:8000/ready > /dev/null && break
    kill -0 $gw 2> /dev/null || break
    sleep 1
  done
  if curl -sf http://127.0.0.1:8000/ready > /dev/null; then
    stamp "$label ready"
    { nvidia-smi --query-gpu=index,uuid,memory.used,memory.total --format=csv,noheader; nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader; } | tee "$R/gpu_mem_$label.txt"
    python3 -m bench.gpu.smoke --model llama2-7b --concurrency 32 | tee "$R/smoke_$label.jsonl"
    [[ ${SMOKE_ONLY:-0} == 1 ]] || python3 -m bench.loadgen --base-url http://127.0.0.1:8000/v1 --model llama2-7b --endpoint completions \
      --prompt-tokens 128 --output-tokens 256 --concurrency $3 --label "turbomind-fp16-$label" \
      --notes "H200 with memory held to $gpus; random-weight Llama-2-7B shape; through voltgate" \
      --output "$R/loadgen_$label.json" 2>&1 | tail -15
    stamp "$label done"
  else
    stamp "$label NOT READY"; tail -60 "$R/gateway_$label.log"
  fi
  kill -TERM $gw 2> /dev/null; wait $gw 2> /dev/null
  stamp "gateway exited; workers left: $(pgrep -fc 'lmdeploy serve' || true)"
}

python3 .gpu/hold_memory.py --leave-free-mib 32510 --device 0 > "$R/hold0.log" 2>&1 & H0=$!
sleep 8; cat "$R/hold0.log"
serve_and_test v100-32gb v100-32gb "1 4 8 16 32"
kill $H0; wait $H0 2> /dev/null

if [[ $(nvidia-smi -L | wc -l) -ge 2 ]]; then
  python3 .gpu/hold_memory.py --leave-free-mib 16160 --device 0 > "$R/hold0.log" 2>&1 & H0=$!
  python3 .gpu/hold_memory.py --leave-free-mib 16160 --device 1 > "$R/hold1.log" 2>&1 & H1=$!
  sleep 8; cat "$R/hold0.log" "$R/hold1.log"
  serve_and_test 2xv100-16gb 2xv100-16gb "1 8 16"
  kill $H0 $H1; wait $H0 $H1 2> /dev/null
fi
stamp end
