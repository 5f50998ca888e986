#!/usr/bin/env bash
# ON THE GPU MACHINE (one H200), from the repo root, .gpu/ carried; one device call per invocation, back to back
# on the warm machine (state in /tmp/gpu and /tmp/s3 survives between calls there):
#   VG_COMMIT=<sha> CALL=1 bash bench/gpu/run_session3.sh $OUT setup features pvm:tm-fp16-32gb gguf-wait:200 ...
# Steps, run in the order given, each skipped when less time is left than it needs (BUDGET seconds per call):
#   setup              LMDeploy pack, extra wheels, lmdeploy shim; the llama.cpp CUDA build and then the GGUF
#                      conversion (prepare_gguf.sh: 7b F16, Q8_0, Q4_K_M) start in the background (setsid)
#   models             random-weight HF models, 1b and 7b shapes (make_model.py, on the GPU, before any hold)
#   features           issues #11/#12/#14: TurboMind FP16 1b via voltgate serve (tm-1b-features.yaml, lmdeploy
#                      tool_parser qwen), H200 held to a V100-16GB's free memory: plan --json, /v1/models,
#                      bench.gpu.turbomind_features
#   smoke              wait for the llama.cpp build; a tiny GGUF; bench/gpu/diag_import_order.sh (does importing
#                      numpy first crash the load?) and our worker (generate, all layers on GPU) answering a completion
#   gguf-wait:N        wait up to N s for the GGUF files (and never past GGUF_WAIT_RESERVE s, default 100, before
#                      the end of BUDGET); GGUF_QUANTS (default "q8_0 q4_k_m"): the quants prepare_gguf.sh makes
#   pvm:A,B,...        issue #16: bench.gpu.predict_vs_measure on those scenarios of configs/pvm-scenarios.yaml
#                      (PVM_ARGS: more arguments for it, e.g. "--prompt-tokens 256"; PVM_NEED: the seconds it
#                      needs left to start, default 90)
#   swap               issue #15: bench/gpu/swap.py (TurboMind 7B + llama.cpp GGUF, held to a V100-32GB)
#   embed              issue #13: bge-base-shaped random BERT GGUF, bench.gpu.embeddings_gpu (all layers on GPU)
#   vlm                issue #25: a random-weight Qwen2-VL-2B shape (bench.gpu.make_vlm) on TurboMind via voltgate
#                      serve, held to a V100-16GB's free memory: plan, bench.gpu.vlm_turbomind (images, batching,
#                      memory estimated vs measured). SKIP_LLAMA=1 before `setup` leaves out the llama.cpp build.
#   vlm25              the same with a random Qwen2.5-VL-3B shape (tm-vlm25-16gb.yaml)
# Everything lands in /tmp/s3/results and is packed into $OUT/results_call$CALL.tar.gz at the end.
set -uo pipefail
OUT=${1:?usage: run_session3.sh OUT STEP...}; shift
CALL=${CALL:-0}; BUDGET=${BUDGET:-540}; PORT=${PORT:-8000}
export G=/tmp/gpu
R=/tmp/s3/results; mkdir -p "$R" "$G"
exec > >(tee -a "$R/run_session3.log") 2>&1
stamp() { echo "== [call $CALL $(date +%T) +${SECONDS}s] $*"; }
left() { echo $((BUDGET - SECONDS)); }
pack() {
  stamp "packing"
  tail -c 2000000 "$G/llama_build.log" > "$R/llama_build_tail.log" 2> /dev/null
  cp "$G/prepare_gguf.log" "$R/" 2> /dev/null; cp "$G/gguf/convert.jsonl" "$R/" 2> /dev/null
  tar czf "$OUT/results_call$CALL.tar.gz" -C /tmp/s3 results
  cp "$R/run_session3.log" "$OUT/"
  for f in "$R"/pvm/predict_vs_measure.md "$R"/features/features.jsonl "$R"/vlm/vlm.jsonl "$R"/vlm/plan_vlm-16gb.txt \
           "$R"/vlm25/vlm25.jsonl "$R"/vlm25/plan_vlm25-16gb.txt; do [[ -f $f ]] && cp "$f" "$OUT/"; done
  ls -la "$OUT"
}
trap pack EXIT
stamp "start: $*"; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
echo "commit ${VG_COMMIT:-unknown}" >> "$R/commits.txt"

env_on() {
  source "$G/env.sh"
  export PYTHONPATH=$PWD:/tmp/site2:$PYTHONPATH PYTHONUNBUFFERED=1 PATH=/tmp/bin:$PATH
}

end_leftover_on_port() {  # a gateway a killed step left behind: end it by its pid
  local pid
  for pid in $(ss -ltnpH "sport = :$PORT" 2> /dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do
    echo "ending leftover pid $pid on :$PORT"; kill -TERM "$pid"; sleep 5; kill -KILL "$pid" 2> /dev/null
  done
}

hold_pid=""
hold() {  # $1 = MiB to leave free
  python3 .gpu/hold_memory.py --leave-free-mib "$1" > "$R/hold_$1.log" 2>&1 & hold_pid=$!
  for _ in $(seq 1 120); do grep -q holding "$R/hold_$1.log" && break; kill -0 $hold_pid 2> /dev/null || break; sleep 0.5; done
  cat "$R/hold_$1.log"
}
unhold() { [[ -n $hold_pid ]] && { kill -TERM $hold_pid; wait $hold_pid 2> /dev/null; hold_pid=""; }; }

wait_ready() {  # $1 = gateway pid, $2 = seconds
  for _ in $(seq 1 "$2"); do
    curl -sf http://127.0.0.1:$PORT/ready > /dev/null && return 0
    kill -0 "$1" 2> /dev/null || return 1
    sleep 1
  done
  return 1
}

step_setup() {
  if [[ ! -f $G/env.sh ]]; then
    bash .gpu/setup_device.sh .gpu/pack lmdeploy > "$R/setup_lmdeploy.log" 2>&1 || { tail -30 "$R/setup_lmdeploy.log"; return 1; }
  fi
  tail -3 "$R/setup_lmdeploy.log"
  if [[ -z ${SKIP_LLAMA:-} && ! -f $G/llama_build.rc && ! -f $G/llama_build.started ]]; then
    touch $G/llama_build.started
    setsid nohup nice -n 10 bash -c "bash .gpu/setup_device.sh .gpu/pack llama > $G/llama_build.log 2>&1; echo \$? > $G/llama_build.rc" > /dev/null 2>&1 < /dev/null &
  fi
  bash bench/gpu/install_extra.sh
  mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m lmdeploy "$@"\n' > /tmp/bin/lmdeploy && chmod +x /tmp/bin/lmdeploy
  env_on
  python3 -c "import lmdeploy, gateway.app, gateway.cli; print('lmdeploy', lmdeploy.__version__)"
}

step_models() {
  env_on
  for s in 1b 7b; do
    [[ -f $G/models/$s/config.json && -f $G/models/$s/made ]] && continue
    python3 .gpu/make_model.py $G/models/$s --shape $s > "$R/make_model_$s.log" 2>&1 && touch $G/models/$s/made
    tail -1 "$R/make_model_$s.log"
  done
  # the GGUF conversion waits for the build, then converts the 7b (CPU only) in the background
  if [[ ! -f $G/gguf/ready && ! -f $G/gguf.started ]]; then
    touch $G/gguf.started
    setsid nohup nice -n 5 bash bench/gpu/prepare_gguf.sh > $G/prepare_gguf.log 2>&1 < /dev/null &
  fi
}

step_features() {
  env_on; end_leftover_on_port
  local D=$R/features C=${FEATURES_CONFIG:-bench/gpu/configs/tm-1b-features.yaml} M=${FEATURES_MODEL:-tm}
  mkdir -p "$D"
  hold 16160
  python3 -m gateway plan --config $C --gpus auto --json > "$D/plan_tm-1b-16gb.json" 2> "$D/plan_stderr.txt"
  python3 -m gateway plan --config $C --gpus auto > "$D/plan_tm-1b-16gb.txt" 2>&1
  python3 -m gateway serve --config $C --gpus auto --port $PORT > "$D/gateway_tm-1b-16gb.log" 2>&1 & local gw=$!
  if wait_ready $gw 240; then
    stamp "features: gateway ready"
    curl -s http://127.0.0.1:$PORT/v1/models > "$D/v1_models.json"; cat "$D/v1_models.json"; echo
    curl -s http://127.0.0.1:$PORT/v1/placement > "$D/v1_placement.json"
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader | tee "$D/gpu_mem.txt"
    timeout 240 python3 -m bench.gpu.turbomind_features --base-url http://127.0.0.1:$PORT --model $M \
      --out "$D/features.jsonl" 2> "$D/features_stderr.txt"
    cat "$D/features_stderr.txt"
  else
    stamp "features: gateway NOT READY"; tail -40 "$D/gateway_tm-1b-16gb.log"
  fi
  kill -TERM $gw 2> /dev/null; wait $gw 2> /dev/null
  unhold
}

step_smoke() {
  env_on
  local D=$R/smoke; mkdir -p "$D"
  while [[ ! -f $G/llama_build.rc ]] && (($(left) > 150)); do sleep 3; done
  stamp "smoke: build rc $(cat $G/llama_build.rc 2> /dev/null || echo running)"
  [[ -f $G/llama_build.rc && $(cat $G/llama_build.rc) == 0 ]] || return 1
  if [[ ! -f $G/tiny.gguf ]]; then
    python3 .gpu/make_model.py $G/tiny --shape tiny > "$D/make_tiny.log" 2>&1
    python3 .gpu/llamacpp_bench.py convert $G/tiny $G/tiny.gguf --llama-src $G/src/llama_cpp_python-0.3.36 > "$D/convert_tiny.log" 2>&1
    tail -2 "$D/convert_tiny.log"
  fi
  timeout 120 bash bench/gpu/diag_import_order.sh $G/tiny.gguf 2>&1 | tee "$D/diag_import_order.txt"
  PYTHONFAULTHANDLER=1 timeout 60 python3 -m backends.llamacpp.worker --model-name t --port 9100 --max-queue 8 \
    --model $G/tiny.gguf --ctx 256 --slots 2 --n-gpu-layers -1 > "$D/worker.log" 2>&1 & local w=$!
  for _ in $(seq 1 60); do curl -sf http://127.0.0.1:9100/health > /dev/null && break; kill -0 $w 2> /dev/null || break; sleep 0.5; done
  local answer=""
  if curl -sf http://127.0.0.1:9100/health > /dev/null; then
    answer=$(curl -s -m 30 http://127.0.0.1:9100/v1/completions -H 'content-type: application/json' \
      -d '{"model":"t","prompt":"hello","max_tokens":4}' | head -c 300)
    kill -TERM $w
  fi
  wait $w; stamp "smoke: worker rc $? answer ${answer:0:120}"; grep -v '^\s*$' "$D/worker.log" | tail -12
}

step_gguf_wait() {  # $1 = seconds
  local r=${GGUF_WAIT_RESERVE:-100} n
  n=$(( ($1 < $(left) - r ? $1 : $(left) - r) / 3 ))
  for _ in $(seq 1 $n); do [[ -f $G/gguf/ready ]] && break; [[ -f $G/llama_build.rc && $(cat $G/llama_build.rc) != 0 ]] && break; sleep 3; done
  stamp "gguf ready: $([[ -f $G/gguf/ready ]] && echo yes || echo no); build rc $(cat $G/llama_build.rc 2> /dev/null || echo running)"
  ls -la $G/gguf 2> /dev/null; tail -3 $G/prepare_gguf.log 2> /dev/null
  [[ -f $G/gguf/ready ]]
}

step_pvm() {  # $1 = comma-separated scenario names
  env_on; end_leftover_on_port
  local names=${1//,/ }
  timeout -s TERM $(($(left) - 20)) python3 -m bench.gpu.predict_vs_measure run \
    --scenarios ${PVM_SCENARIOS:-bench/gpu/configs/pvm-scenarios.yaml} --only $names --gpus auto --out-dir "$R/pvm" \
    --hold-script .gpu/hold_memory.py --python python3 --port $PORT --skip-done --commit "${VG_COMMIT:-unknown}" ${PVM_ARGS:-} 2>&1 | grep -v '^\s*$'
  end_leftover_on_port
}

step_swap() {  # bench/gpu/swap.py (its run_swap.sh's steps, with this script's setup, hold and time limit)
  env_on; end_leftover_on_port
  [[ -f bench/gpu/swap.py ]] || { stamp "swap: bench/gpu/swap.py does not exist in this tree"; return 1; }
  [[ -f $G/gguf/ready ]] || { stamp "swap: the GGUF files are not ready"; return 1; }
  local D=$R/swap C=bench/gpu/configs/swap-7b.yaml; mkdir -p "$D"
  [[ -f $D/swap.json ]] && grep -q '"fatal": null' "$D/swap.json" && { stamp "swap: already done"; return 0; }
  hold 32510
  COLUMNS=160 python3 -m gateway plan --config $C > "$D/plan_swap.txt" 2>&1; cat "$D/plan_swap.txt"
  python3 -m gateway plan --config $C --json > "$D/plan_swap.json" 2>&1
  timeout -s TERM $(($(left) - 25)) python3 -m bench.gpu.swap --config $C --output "$D/swap.json" \
    --rounds "${ROUNDS:-2}" --concurrency "${CONCURRENCY:-4}" --port $PORT
  echo "swap.py exit $?"
  { nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; } > "$D/gpu_mem_after.txt"
  end_leftover_on_port
  unhold
}

step_embed() {
  env_on
  local D=$R/embed; mkdir -p "$D"
  [[ -f $G/bge-base-shape.gguf ]] || python3 -m bench.gpu.bert_gguf $G/bge-base-shape.gguf
  timeout -s TERM $(($(left) - 10)) python3 -m bench.gpu.embeddings_gpu --model $G/bge-base-shape.gguf --seconds ${EMBED_SECONDS:-20} \
    --log-dir "$D" --out "$D/embeddings-bge-base-shape-gpu.json" 2>&1 | tail -6
  if (($(left) > 60)); then
    timeout -s TERM $(($(left) - 10)) python3 -m bench.gpu.embeddings_gpu --model $G/bge-base-shape.gguf --seconds 20 \
      --n-batch 4096 --ctx 512 --log-dir "$D" --out "$D/embeddings-bge-base-shape-gpu-nbatch4096.json" 2>&1 | tail -6
  fi
  nvidia-smi --query-gpu=memory.used --format=csv,noheader > "$D/gpu_mem_after.txt"
}

step_vlm() {  # $1 = results folder, $2 = make_vlm shape, $3 = config (its source: /tmp/gpu/models/<$1>)
  env_on; end_leftover_on_port
  local D=$R/$1 C=$3 M=$G/models/${4:-$1}; mkdir -p "$D"
  if [[ ! -f $M/made ]]; then
    python3 -m bench.gpu.make_vlm $M --shape $2 > "$D/make_vlm.log" 2>&1 && touch $M/made
    tail -1 "$D/make_vlm.log"
  fi
  hold 16160
  COLUMNS=160 python3 -m gateway plan --config $C --gpus auto > "$D/plan_$1-16gb.txt" 2>&1; cat "$D/plan_$1-16gb.txt"
  python3 -m gateway plan --config $C --gpus auto --json > "$D/plan_$1-16gb.json" 2> "$D/plan_stderr.txt"
  python3 -m gateway serve --config $C --gpus auto --port $PORT > "$D/gateway_$1-16gb.log" 2>&1 & local gw=$!
  if wait_ready $gw 300; then
    stamp "vlm: gateway ready"
    curl -s http://127.0.0.1:$PORT/v1/models > "$D/v1_models.json"
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader | tee "$D/gpu_mem_ready.txt"
    timeout -s TERM $(($(left) - 25)) python3 -m bench.gpu.vlm_turbomind --base-url http://127.0.0.1:$PORT \
      --model vlm --out "$D/$1.jsonl" --hold-pid "$hold_pid" 2> "$D/vlm_stderr.txt"
    echo "vlm_turbomind exit $?"; cat "$D/vlm_stderr.txt"
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader | tee "$D/gpu_mem_after.txt"
  else
    stamp "vlm: gateway NOT READY"; tail -60 "$D/gateway_$1-16gb.log"
  fi
  kill -TERM $gw 2> /dev/null; wait $gw 2> /dev/null
  grep -v '^\s*$' "$D/gateway_$1-16gb.log" | grep -v 'GET /v1/models\|POST /v1/chat\|voltgate.access' | tail -25
  unhold
}

need() {  # $1 = step, $2 = seconds it needs
  if (($(left) < $2)); then stamp "SKIP $1: $(left) s left, needs $2"; return 1; fi
  stamp "step $1"
}

for s in "$@"; do
  case $s in
    setup) need setup 60 && step_setup ;;
    models) need models 60 && step_models ;;
    features) need features 120 && step_features ;;
    smoke) need smoke 60 && step_smoke ;;
    gguf-wait:*) need "$s" 10 && step_gguf_wait "${s#gguf-wait:}" ;;
    pvm:*) need "$s" "${PVM_NEED:-90}" && step_pvm "${s#pvm:}" ;;
    swap) need swap 170 && step_swap ;;
    embed) need embed 50 && step_embed ;;
    vlm) need vlm 150 && step_vlm vlm 2b bench/gpu/configs/tm-vlm-16gb.yaml vlm2b ;;
    vlm25) need vlm25 170 && step_vlm vlm25 2.5-3b bench/gpu/configs/tm-vlm25-16gb.yaml ;;
    *) stamp "unknown step $s" ;;
  esac
done
stamp "end"
