#!/usr/bin/env bash
# ON THE GPU MACHINE (one H200), repo root, .gpu/ carried (/work/shared/gpu/README.md, "From a project checkout"):
#   bash bench/gpu/run_swap.sh RESULTS_DIR
# Model swapping (issue #15) on a "V100-32GB" (the H200 held to 32,510 MiB free): bench/gpu/configs/swap-7b.yaml
# has a TurboMind FP16 7B and a llama.cpp Q8_0 7B, both load: on_demand, that cannot both fit; bench/gpu/swap.py
# alternates requests between them through `voltgate serve` and writes swap times, NVML-measured memory next to
# the estimates, and errors to RESULTS_DIR/swap.json (its gateway log beside it).
# Every step is skipped when already done, so on a warm machine a second call only runs the swaps: if the first
# call hits the 10-minute limit while building llama.cpp or converting the GGUF, run it again.
#   ROUNDS=4 CONCURRENCY=4 (defaults) set how many times each model is asked for and how many requests at once.
set -uo pipefail
R=${1:?results dir}; mkdir -p "$R"
export G=/tmp/gpu
exec > >(tee -a "$R/run_swap.log") 2>&1
stamp() { echo "== [$(date +%T) +${SECONDS}s] $*"; }
stamp start; nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv,noheader

[[ -f $G/env.sh ]] || bash .gpu/setup_device.sh .gpu/pack lmdeploy > "$R/setup_lmdeploy.log" 2>&1 || { stamp "setup failed"; tail -30 "$R/setup_lmdeploy.log"; exit 1; }
if [[ ! -f $G/llama_build.rc ]] && ! pgrep -f "setup_device.sh .gpu/pack llama" > /dev/null; then
  setsid nohup nice -n 10 bash -c "bash .gpu/setup_device.sh .gpu/pack llama > $G/llama_build.log 2>&1; echo \$? > $G/llama_build.rc" > /dev/null 2>&1 &
fi
source "$G/env.sh"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site2 .gpu/extra/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site2:$PYTHONPATH PYTHONUNBUFFERED=1
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m lmdeploy "$@"\n' > /tmp/bin/lmdeploy && chmod +x /tmp/bin/lmdeploy
export PATH=/tmp/bin:$PATH
python3 -c "import lmdeploy, gateway, backends; print('lmdeploy', lmdeploy.__version__)"

[[ -f $G/models/7b/config.json ]] || { stamp "make model 7b"; python3 .gpu/make_model.py $G/models/7b --shape 7b > "$R/make_model.log" 2>&1; }
[[ -f $G/gguf/ready ]] || { stamp "GGUF (waits for the llama.cpp build)"; bash bench/gpu/prepare_gguf.sh > "$R/prepare_gguf.log" 2>&1; }
[[ -f $G/gguf/ready ]] || { stamp "GGUF not ready"; tail -20 "$R/prepare_gguf.log" $G/llama_build.log; exit 1; }
stamp "models ready"; ls -la $G/gguf

python3 .gpu/hold_memory.py --leave-free-mib 32510 --device 0 > "$R/hold0.log" 2>&1 & H0=$!
sleep 8; cat "$R/hold0.log"
C=bench/gpu/configs/swap-7b.yaml
COLUMNS=160 python3 -m gateway plan --config $C > "$R/plan_swap.txt" 2>&1; cat "$R/plan_swap.txt"
python3 -m bench.gpu.swap --config $C --output "$R/swap.json" --rounds "${ROUNDS:-4}" --concurrency "${CONCURRENCY:-4}"
rc=$?
{ nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; } > "$R/gpu_mem_after.txt"
kill $H0; wait $H0 2> /dev/null
stamp "end (swap.py exit $rc); workers left: $(pgrep -fc 'lmdeploy serve|backends.llamacpp.worker' || true)"
exit $rc
