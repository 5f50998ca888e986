#!/usr/bin/env bash
# ON THE GPU MACHINE, after run_turbomind.sh on the same (still warm) machine:
#   bash bench/gpu/run_llamacpp.sh RESULTS_DIR
# 1. the placement check on a V100-16GB (H200 held to 16,160 MiB free): 7B with HF FP16 + GGUF F16/Q8_0/Q4_K_M,
#    4,096 context -> the plan must pick llama.cpp Q8_0 fully offloaded; serve it, run the smoke scenarios, record
#    the GPU memory the worker really uses next to the plan's estimate;
# 2. continuous batching (issue 6): our worker with --slots 1 vs --slots 16 at concurrency 1/4/8/16, Q8_0 and Q4_K_M;
# 3. batch-1 decode speed of F16/Q8_0/Q4_K_M in-process (llamacpp_bench.py) and the device copy bandwidth.
set -uo pipefail
R=${1:?results dir}; mkdir -p "$R"
export G=/tmp/gpu
exec > >(tee -a "$R/run_llamacpp.log") 2>&1
stamp() { echo "== [$(date +%T) +${SECONDS}s] $*"; }
stamp start
source "$G/env.sh"
export PYTHONPATH=$PWD:/tmp/site2:$PYTHONPATH PYTHONUNBUFFERED=1
for _ in $(seq 1 200); do [[ -f $G/gguf/ready ]] && break; sleep 3; done
[[ -f $G/gguf/ready ]] || { stamp "GGUF files not ready"; tail -20 $G/llama_build.log; exit 1; }
ls -la $G/gguf; cp $G/gguf/convert.jsonl "$R/" 2> /dev/null
gpu_used() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; }

# 1. placement on a 16 GB card, served for real
python3 .gpu/hold_memory.py --leave-free-mib 16160 --device 0 > "$R/hold0.log" 2>&1 & H0=$!
sleep 8; cat "$R/hold0.log"
C=bench/gpu/configs/gguf-7b-v100-16gb.yaml
python3 -m gateway plan --config $C --gpus v100-16gb > "$R/plan_gguf_v100-16gb.txt" 2>&1; cat "$R/plan_gguf_v100-16gb.txt"
python3 -m gateway plan --config $C --gpus v100-16gb --json > "$R/plan_gguf_v100-16gb.json" 2>&1
python3 -m gateway serve --config $C --gpus v100-16gb > "$R/gateway_gguf_v100-16gb.log" 2>&1 & GW=$!
for _ in $(seq 1 200); do curl -sf http://127.0.0.1:8000/ready > /dev/null && break; kill -0 $GW || break; sleep 1; done
if curl -sf http://127.0.0.1:8000/ready > /dev/null; then
  stamp "gguf gateway ready"; gpu_used | tee "$R/gpu_mem_gguf_v100-16gb.txt"
  python3 -m bench.gpu.smoke --model llama2-7b --concurrency 16 | tee "$R/smoke_gguf_v100-16gb.jsonl"
  gpu_used | tee -a "$R/gpu_mem_gguf_v100-16gb.txt"
else
  stamp "gguf gateway NOT READY"; tail -40 "$R/gateway_gguf_v100-16gb.log"
fi
kill -TERM $GW; wait $GW 2> /dev/null; kill $H0; wait $H0 2> /dev/null

# 2. one slot vs sixteen, same worker program, straight to the worker
for q in q8_0 q4_k_m; do
  for slots in 1 16; do
    python3 -m backends.llamacpp.worker --model $G/gguf/7b-$q.gguf --model-name llama2-7b --port 9100 \
      --ctx 512 --slots $slots --n-gpu-layers -1 --max-queue 256 > "$R/worker_${q}_slots$slots.log" 2>&1 & W=$!
    for _ in $(seq 1 120); do curl -sf http://127.0.0.1:9100/health > /dev/null && break; sleep 0.5; done
    python3 -m bench.loadgen --base-url http://127.0.0.1:9100/v1 --model llama2-7b --endpoint completions \
      --prompt-tokens 64 --output-tokens 128 --concurrency 1 4 8 16 --warmup 2 \
      --label "llamacpp-$q-slots$slots" --notes "H200 (no memory hold); random-weight Llama-2-7B shape; worker direct" \
      --output "$R/batching_${q}_slots$slots.json" 2>&1 | tail -8
    kill -TERM $W; wait $W 2> /dev/null
  done
done
stamp "batching done"

# 3. batch-1 decode, in-process, and the copy bandwidth that bounds it
python3 .gpu/llamacpp_bench.py --json "$R/llamacpp_batch1.jsonl" --tag llamacpp-7b bench \
  $G/gguf/7b-f16.gguf $G/gguf/7b-q8_0.gguf $G/gguf/7b-q4_k_m.gguf --reps 2 2>&1 | tail -8
python3 - << 'PY' | tee "$R/copy_bandwidth.json"
import json, torch
x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize(); s, e = torch.cuda.Event(True), torch.cuda.Event(True); s.record()
for _ in range(10): y.copy_(x)
e.record(); torch.cuda.synchronize(); ms = s.elapsed_time(e) / 10
print(json.dumps({"copy_bytes": x.numel(), "read_plus_write_GBps": round(2 * x.numel() / ms / 1e6, 1), "read_GBps": round(x.numel() / ms / 1e6, 1)}))
PY
stamp end
