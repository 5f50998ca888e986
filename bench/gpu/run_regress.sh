#!/usr/bin/env bash
# ON THE GPU MACHINE, from the repo root, `.gpu/` carried (bench/gpu/prepare_regress_pack.sh made it):
#
#   bash bench/gpu/run_regress.sh $OUT [WAIT_S]
#
# Starts the whole regression benchmark once, detached (setsid nohup: it outlives this call), then waits up to
# WAIT_S seconds (default 540, under a device call's 600 s limit) for it to finish, and tars what exists so far
# into $OUT/regress-<time>.tar.gz with the log's tail. Call it again, on the still-warm machine, to keep
# polling: a second call never starts a second run. A fresh machine (the last one was taken back) starts over.
#
# The detached run (state in /tmp/regress; "== step" lines in /tmp/regress/run.log):
#   setup    LMDeploy pack (.gpu/setup_device.sh lmdeploy), the gateway's packages (bench/gpu/install_extra.sh) into /tmp/site2,
#            an `lmdeploy` command; in the background, niced: the llama-cpp-python CUDA build (our worker) and
#            the llama-server build from .gpu/pack/llama_server_src.tar.xz (sm_90, same llama.cpp commit)
#   models   the random-weight Llama-2-7B shape (.gpu/make_model.py 7b), then, once the build is done, its GGUF
#            F16 -> Q8_0, Q4_K_M (bench/gpu/prepare_gguf.sh); the random-weight MoE GGUF for the moe-experts
#            pair (bench/gpu/make_moe_gguf.py, tokenizer from the 7B GGUF), unless REGRESS_ARGS leaves it out
#   bench    python3 -m bench.gpu.regress --out /tmp/regress/out/<date>-gpu-regress (it holds the GPU's memory
#            to a V100's per pair with .gpu/hold_memory.py), then `done`
# STEPS (default "setup model gguf server bench") picks and orders the detached run's steps:
#   setup, model, gguf, server   the three parts above (gguf: the GGUF files; server: wait for llama-server's build)
#   moegguf                      the MoE GGUF alone, its vocabulary from .gpu/tokenizer.gguf: it needs no build, so
#                                put it before `gguf` to write its 16.6 GB while llama.cpp compiles
#   moediag                      our worker on the MoE GGUF, all layers then 36 on the GPU (no hold): 8 greedy tokens with
#                                their logprobs printed (what the model gives on CUDA: text, or empty/special tokens)
#   pvm:S1,S2                    bench.gpu.predict_vs_measure --only S1 S2 (pvm-scenarios.yaml), into out/<date>-pvm-S1
#   bench                        bench.gpu.regress with REGRESS_ARGS, into out/<date>-gpu-regress
#   bench:P1,P2                  bench.gpu.regress --only P1 P2 $PAIR_ARGS (e.g. "--requests 16 --output-tokens 128" where
#                                device time is short), into out/<date>-gpu-regress-P1
#   sessions:tm | sessions:gguf  bench.session_replay --gpu, caching on then off (configs session-tm-7b*.yaml held to
#                                a V100-32GB, session-gguf-7b*.yaml held to a V100-16GB), into out/<date>-session-replay-*
#   sessions:llama-server        the same sessions against llama-server --cache-ram 8192 (Q4_K_M, 2 slots of 16,384
#                                tokens of KV q8_0, held to 16 GB: its own rendering of the same turns is 12-15k tokens,
#                                so the configs' 3 x 10,240 refused Claude Code's and Open WebUI's; the 7B's trained
#                                context raised to 32k with --override-kv: llama-server caps a slot at it, 4,096)
#   turns:gguf                   bench.turn_overhead on session-gguf-7b.yaml held to a V100-16GB: what a cached agent
#                                turn costs besides its new tokens, py-spy on the gateway and the worker (packed in
#                                .gpu/site2.tar.xz), into out/<date>-turn-overhead-gguf
#   hybrid:gguf                  issue 39: a hybrid model's context checkpoints on CUDA: bench.hybrid_checkpoints_cpu --gpu
#                                (the tiny random-weight Qwen3-Next, every layer on the GPU, checkpoints on vs off,
#                                its vocabulary from .gpu/tokenizer.gguf), into out/<date>-hybrid-checkpoints-gpu
#   hybridmem:gguf               issue 39: the tiny hybrids' KV and recurrent state as planned for a V100-16GB and as
#                                llama.cpp's CUDA build allocates them, every layer on the GPU (bench.gpu.hybrid_memory),
#                                into out/<date>-hybrid-memory-gpu; a layout that crashes (exit 139) is run again with
#                                no layer on the GPU, with llama.cpp's log streamed, and once under cuda-gdb (its stack)
#   gguf8b                       issue 41: the Llama-3-8B shape (GQA, 8 KV heads for 32 query heads, as 2026's models
#                                have) with the agents' template, GGUF Q4_K_M (its F16 and HF files deleted after; the
#                                7B's F16 GGUF first, for disk space: put `gguf8b` after any step that needs it;
#                                the HF folder stays for sessions:tm8b)
#   depth:gguf                   issue 41: the engine's own price of a cached prefix (bench.prefill_depth: 64-512 new
#                                tokens after 0 / 4,096 / 8,192 cached, one slot of 10,240, KV q8_0 then f16, held to a
#                                V100-16GB) for the 7B and, if made, the 8B, into out/<date>-prefill-depth-gpu/<model>-<kv>
#   sessions:gguf8b, sessions:tm8b  issue 41: sessions:gguf and sessions:tm on the 8B (session-{gguf,tm}-8b*.yaml; the
#                                plan's own KV choice), after gguf8b
#   sessions:gguf-f16kv          issue 41: the llama.cpp session replay with KV f16 (2 slots of 10,240: the plan's f16
#                                fit) where sessions:gguf's plan takes q8_0, caching on only: how much of a cached
#                                turn's extra over a one-turn prompt is attention over a quantized KV
#   split:tm8b                   issue 41: a TurboMind cached turn's TTFT split (bench.gpu.tm_turn_split: through the
#                                gateway, straight to LMDeploy, as token ids; its template and tokenizer timed; a fresh
#                                prompt of the uncached count), the 8B held to a V100-32GB, into out/<date>-tm-turn-split
#   reasoning:tm                 TurboMind's reasoning parser through the gateway on each API (bench/gpu/tm_reasoning.py,
#                                the 7B with a thinking template, held to 32 GB), into out/<date>-tm-reasoning
#   replicas:tm                  issue 38: TurboMind, the 1B shape, 2 replicas vs 1 in one V100-32GB's memory (ABBA,
#                                bench.loadgen at 16/32/64 streams through the gateway), into out/<date>-replicas-tm
#   moe:tm                       issue 39: a random-weight Qwen3-MoE (bench/gpu/make_moe_hf.py) on TurboMind, the plan's
#                                sizing and speed against the run (predict_vs_measure, 32 GB), into out/<date>-tm-moe
#   moe:tm-bf16                  the same served as BF16 (TurboMind 0.18 has no grouped FP16 GEMM on sm_90), into
#                                out/<date>-tm-moe-bf16
# ONE_BUILD=1: one CUDA build instead of two (about half the build's device time): llama-server's, whose
# libllama/libggml/libmtmd the worker's llama-cpp-python then loads (LLAMA_CPP_LIB_PATH, MTMD_CPP_LIB): both sides
# run the very same llama.cpp binaries.
# TurboMind steps need only `setup model`: put them before `gguf` to use the build's minutes, or set SKIP_LLAMA=1
# to start no llama.cpp build at all.
# A poll call sends the checkout again and each step runs the code it finds then: write the commit a call
# sends into bench/gpu/.tree (git-ignored, carried) and each "== step" line names the code that step ran.
# Commit the folder from the tarball under bench/results/ with this command in its README.
set -uo pipefail
OUT=${1:?usage: run_regress.sh OUT [WAIT_S]}
WAIT_S=${2:-540}
S=/tmp/regress
export G=/tmp/gpu
mkdir -p "$S" "$G" "$OUT"

if [[ ${REGRESS_DETACHED:-} != 1 ]]; then
  if [[ ! -f $S/started ]]; then
    date -u +%FT%TZ > "$S/started"
    REGRESS_DETACHED=1 setsid nohup bash "$0" "$S/out" > "$S/run.log" 2>&1 < /dev/null &
    echo "started the regression run (pid $!)"
  else
    echo "a run started at $(cat "$S/started") is $([[ -f $S/done ]] && echo finished || echo still running)"
  fi
  for _ in $(seq 1 "$WAIT_S"); do [[ -f $S/done ]] && break; sleep 1; done
  stamp=$(date -u +%H%M%S)
  tar czf "$OUT/regress-$stamp.tar.gz" -C "$S" out run.log started $([[ -f $S/done ]] && echo done) 2> /dev/null
  tail -40 "$S/run.log"
  [[ -f $S/done ]] && { echo "== finished"; cat "$S"/out/*/regress.md 2> /dev/null; exit 0; }
  echo "== still running: call this again to keep polling"
  exit 0
fi

stamp() { echo "== [$(date -u +%T) +${SECONDS}s] $*"; }
HOLD_PID=
hold() {  # hold the GPU's memory to leave $1 MiB free (a V100's), until release
  python3 .gpu/hold_memory.py --leave-free-mib "$1" > "$S/hold.log" 2>&1 &
  HOLD_PID=$!
  for _ in $(seq 1 120); do grep -q holding "$S/hold.log" && return 0; sleep 1; done
  stamp "hold $1 MiB: no 'holding' line"; tail -3 "$S/hold.log"
}
release() { [[ -n $HOLD_PID ]] && kill "$HOLD_PID" && wait "$HOLD_PID" 2> /dev/null; HOLD_PID=; }

step_setup() {
  [[ -f $G/env.sh ]] || bash .gpu/setup_device.sh .gpu/pack lmdeploy > "$S/setup_lmdeploy.log" 2>&1 \
    || { stamp "setup lmdeploy FAILED"; tail -30 "$S/setup_lmdeploy.log"; }
  bash bench/gpu/install_extra.sh
  mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m lmdeploy "$@"\n' > /tmp/bin/lmdeploy && chmod +x /tmp/bin/lmdeploy
  [[ ${SKIP_LLAMA:-} == 1 ]] && { source "$G/env.sh"; return; }  # TurboMind steps only: no llama.cpp builds
  if [[ ${ONE_BUILD:-} == 1 && ! -f $G/llama_build.started ]]; then  # the worker loads the llama-server build's libs
    touch "$G/llama_build.started"
    [[ -d $G/src/llama_cpp_python-0.3.36 ]] || { mkdir -p "$G/src"; python3 -m tarfile -e .gpu/pack/llama_cpp_python.tar.xz "$G/src"; }
    setsid nohup bash -c "while [[ ! -f $G/server_build.rc ]]; do sleep 2; done; cp $G/server_build.rc $G/llama_build.rc" \
      > /dev/null 2>&1 < /dev/null &
  fi
  if [[ ! -f $G/llama_build.rc && ! -f $G/llama_build.started ]]; then
    touch "$G/llama_build.started"
    setsid nohup nice -n 10 bash -c "bash .gpu/setup_device.sh .gpu/pack llama > $G/llama_build.log 2>&1; echo \$? > $G/llama_build.rc" \
      > /dev/null 2>&1 < /dev/null &
  fi
  if [[ ! -f $G/server_build.rc && ! -f $G/server_build.started ]]; then
    touch "$G/server_build.started"
    cat > "$G/build_server.sh" << EOS
set -e
mkdir -p $G/server-src
[[ -d $G/server-src/llama.cpp ]] || python3 -m tarfile -e $PWD/.gpu/pack/llama_server_src.tar.xz $G/server-src
export PATH=/usr/local/cuda/bin:\$PATH
cmake -S $G/server-src/llama.cpp -B $G/build-server -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=on \\
  -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF \\
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \\
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
cmake --build $G/build-server --target llama-server -j \$(nproc)
EOS
    setsid nohup nice -n 10 bash -c "bash $G/build_server.sh > $G/server_build.log 2>&1; echo \$? > $G/server_build.rc" \
      > /dev/null 2>&1 < /dev/null &
  fi
  source "$G/env.sh"
  python3 -c "import lmdeploy, gateway.app; print('lmdeploy', lmdeploy.__version__)"
}

step_model() {  # the random-weight 7B with a template that renders agents' tools (bench/gpu/agent_template.py)
  if [[ ${SKIP_7B:-} != 1 && ! -f $G/models/7b/made ]]; then  # SKIP_7B=1: only the 8B's steps follow
    python3 .gpu/make_model.py "$G/models/7b" --shape 7b > "$S/make_model_7b.log" 2>&1 && touch "$G/models/7b/made"
    tail -1 "$S/make_model_7b.log"
  fi
  [[ -f $G/models/7b/made ]] && python3 -m bench.gpu.agent_template "$G/models/7b"
  if [[ " ${STEPS:-} " == *" gguf8b "* || " ${STEPS:-} " == *":tm8b "* ]] && [[ ! -f $G/models/8b/made ]]; then
    python3 .gpu/make_model.py "$G/models/8b" --shape 8b > "$S/make_model_8b.log" 2>&1 && touch "$G/models/8b/made"
    tail -1 "$S/make_model_8b.log"
  fi
  [[ -f $G/models/8b/made ]] && python3 -m bench.gpu.agent_template "$G/models/8b"
  return 0
}

step_gguf() {
  [[ -f $G/gguf/ready ]] || bash bench/gpu/prepare_gguf.sh > "$S/prepare_gguf.log" 2>&1
  if [[ " ${REGRESS_ARGS:-moe-experts} " == *" moe-experts"* && ! -f $G/gguf/moe-q4_0.gguf ]]; then  # issue 39's pair
    python3 -m bench.gpu.make_moe_gguf "$G/gguf/7b-f16.gguf" "$G/gguf/moe-q4_0.gguf.tmp" > "$S/make_moe.log" 2>&1 \
      && mv "$G/gguf/moe-q4_0.gguf.tmp" "$G/gguf/moe-q4_0.gguf"; tail -2 "$S/make_moe.log"
  fi
  ls -la "$G/gguf"; tail -3 "$G/llama_build.log"
}

step_gguf8b() {  # issue 41: a GQA shape (Llama-3-8B: 8 KV heads), Q4_K_M, for depth:gguf and sessions:gguf8b
  [[ -f $G/gguf/8b-q4_k_m.gguf ]] && return
  mkdir -p "$G/gguf"  # no `gguf` step before it (SKIP_7B=1): the folder is not there yet
  local B="python3 .gpu/llamacpp_bench.py --json $G/gguf/convert.jsonl --tag llamacpp-8b"
  [[ -f $G/models/8b/made ]] || { python3 .gpu/make_model.py "$G/models/8b" --shape 8b && touch "$G/models/8b/made"; }
  python3 -m bench.gpu.agent_template "$G/models/8b"
  local after=$G/llama_build.rc; [[ " ${STEPS:-} " == *" gguf "* ]] && after=$G/gguf/ready  # the 7B's GGUF first
  for _ in $(seq 1 240); do [[ -f $G/llama_build.rc && -f $after ]] && break; sleep 5; done
  rm -f "$G/gguf/7b-f16.gguf" "$G/gguf/7b-q8_0.gguf"  # disk: 7B HF + Q4 + 8B HF + F16 fit in 64 GB, not with these too
  [[ -f $G/models/8b/made ]] && $B convert "$G/models/8b" "$G/gguf/8b-f16.gguf" --llama-src "$G/src/llama_cpp_python-0.3.36" \
    && $B quantize "$G/gguf/8b-f16.gguf" "$G/gguf/8b-q4_k_m.gguf.tmp" q4_k_m \
    && mv "$G/gguf/8b-q4_k_m.gguf.tmp" "$G/gguf/8b-q4_k_m.gguf"
  stamp "gguf8b exit $?"
  rm -f "$G/gguf/8b-f16.gguf"  # the HF folder stays: sessions:tm8b serves it on TurboMind
  tail -2 "$G/gguf/convert.jsonl"; df -h /tmp | tail -1
}

step_moegguf() {  # issue 39's MoE, written while the build runs (its tokenizer: .gpu/tokenizer.gguf)
  [[ -f $G/gguf/moe-q4_0.gguf ]] && return
  mkdir -p "$G/gguf"
  python3 -m bench.gpu.make_moe_gguf .gpu/tokenizer.gguf "$G/gguf/moe-q4_0.gguf.tmp" > "$S/make_moe.log" 2>&1 \
    && mv "$G/gguf/moe-q4_0.gguf.tmp" "$G/gguf/moe-q4_0.gguf"
  tail -2 "$S/make_moe.log"; ls -la "$G/gguf"
}

step_moediag() {  # what our worker's CUDA run of the random MoE answers (an empty-text answer failed the warm-up once)
  local ngl port=8093 pid
  for ngl in -1 36; do
    python3 -m backends.llamacpp.worker --model "$G/gguf/moe-q4_0.gguf" --model-name moe --host 127.0.0.1 --port $port \
      --ctx 512 --slots 1 --n-gpu-layers $ngl > "$S/moediag-$ngl.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 120); do curl -sf http://127.0.0.1:$port/health > /dev/null && break; kill -0 $pid || break; sleep 1; done
    curl -s -m 60 http://127.0.0.1:$port/v1/completions -H 'content-type: application/json' \
      -d '{"model":"moe","prompt":"Hello there, how are","max_tokens":8,"ignore_eos":true,"temperature":0,"logprobs":1}'
    echo; stamp "moediag ngl $ngl"; tail -2 "$S/moediag-$ngl.log"
    kill $pid; wait $pid 2> /dev/null
  done
}

step_pvm() {  # $1: scenario names, comma-separated: the plan's prediction against `voltgate serve`
  local names=$1 out=$S/out/$(date -u +%F)-pvm-${1%%,*}
  mkdir -p "$out"
  python3 -m bench.gpu.predict_vs_measure run --scenarios bench/gpu/configs/pvm-scenarios.yaml --only ${names//,/ } \
    --gpus auto --out-dir "$out" --hold-script .gpu/hold_memory.py --python python3 --commit "${VG_COMMIT:-unknown}" 2>&1 | tail -30
  stamp "pvm $names exit $?"
}

step_server() {
  for _ in $(seq 1 240); do [[ -f $G/server_build.rc ]] && break; sleep 5; done  # at most 20 min
  stamp "llama-server build rc $(cat "$G/server_build.rc" 2> /dev/null || echo 'still running: B sides not run')"
  tail -3 "$G/server_build.log"
  [[ -x $SERVER ]] && "$SERVER" --version 2>&1 | tail -2
}

step_bench() {  # $1: a name for the folder ('' for the default), then bench.gpu.regress's extra arguments
  local name=$1; shift
  python3 -m bench.gpu.regress --out "$S/out/$(date -u +%F)-gpu-regress${name:+-$name}" --hold-script .gpu/hold_memory.py \
    $([[ -x $SERVER ]] && echo --llama-server "$SERVER") --notes "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) held to a V100's memory; random-weight models" \
    "$@"
  stamp "bench $name exit $?"
}

step_sessions() {  # $1: tm | gguf | llama-server
  local out=$S/out/$(date -u +%F)-session-replay-$1
  local replay=(python3 -m bench.session_replay --out "$out" --model llama2-7b --turns 8 --max-tokens 32 ${SESSION_ARGS:-})
  case $1 in
    tm) hold 32510; "${replay[@]}" --gpu --config bench/gpu/configs/session-tm-7b.yaml \
          --off-config bench/gpu/configs/session-tm-7b-off.yaml ;;
    gguf) hold 16160; "${replay[@]}" --gpu --config bench/gpu/configs/session-gguf-7b.yaml \
          --off-config bench/gpu/configs/session-gguf-7b-off.yaml ;;
    gguf8b) hold 16160; "${replay[@]}" --model llama3-8b --gpu --config bench/gpu/configs/session-gguf-8b.yaml \
          --off-config bench/gpu/configs/session-gguf-8b-off.yaml ;;
    tm8b) hold 32510; "${replay[@]}" --model llama3-8b --gpu --config bench/gpu/configs/session-tm-8b.yaml \
          --off-config bench/gpu/configs/session-tm-8b-off.yaml ;;
    gguf-f16kv) hold 16160; "${replay[@]}" --gpu --config bench/gpu/configs/session-gguf-7b-f16kv.yaml ;;
    llama-server)
      [[ -x $SERVER ]] || { stamp "no llama-server"; return; }
      hold 16160
      "$SERVER" -m "$G/gguf/7b-q4_k_m.gguf" -a llama2-7b -np 2 -c 32768 --override-kv llama.context_length=int:32768 -ngl 999 -fa on -ctk q8_0 -ctv q8_0 --cache-ram 8192 --jinja \
        --host 127.0.0.1 --port 8089 > "$S/llama-server-sessions.log" 2>&1 &
      local pid=$!
      for _ in $(seq 1 120); do curl -sf http://127.0.0.1:8089/health > /dev/null && break; sleep 1; done
      "${replay[@]}" --base-url http://127.0.0.1:8089 --kinds openwebui claude codex
      kill "$pid"; wait "$pid" 2> /dev/null ;;
  esac
  stamp "sessions $1 exit $?"
  release
}

step_hybrid() {  # issue 39: context checkpoints of a hybrid (delta-net + attention) model on CUDA
  local out=$S/out/$(date -u +%F)-hybrid-checkpoints-gpu
  mkdir -p "$out"
  python3 -m bench.hybrid_checkpoints_cpu --gpu --threads 4 --tokenizer .gpu/tokenizer.gguf --out "$out/results.json" \
    --log-dir "$out/logs" > "$out/output.txt" 2>&1
  stamp "hybrid gguf exit $?"
  tail -6 "$out/output.txt"; grep -h "loaded model" "$out"/logs/*.log
}

step_hybridmem() {  # issue 39: the tiny hybrids' KV and recurrent state on CUDA, planned vs allocated
  local out=$S/out/$(date -u +%F)-hybrid-memory-gpu
  mkdir -p "$out"
  local layout rc  # one process per layout: a native crash in one (exit 139 on 2026-12-06) leaves the other's rows
  for layout in qwen3next granitehybrid; do
    PYTHONFAULTHANDLER=1 python3 -m bench.gpu.hybrid_memory --tokenizer .gpu/tokenizer.gguf --layouts $layout --out "$out" \
      > "$out/output-$layout.txt" 2>&1
    rc=$?
    stamp "hybridmem gguf $layout exit $rc"
    tail -8 "$out/output-$layout.txt"
    [[ $rc == 139 ]] || continue
    PYTHONFAULTHANDLER=1 python3 -m bench.gpu.hybrid_memory --tokenizer .gpu/tokenizer.gguf \
      --layouts $layout --n-gpu-layers 0 --out "$out/cpu-layers" > "$out/output-$layout-cpu-layers.txt" 2>&1
    stamp "hybridmem $layout, no layer on the GPU: exit $?"; tail -4 "$out/output-$layout-cpu-layers.txt"
    hybridmem_backtrace "$layout" "$out"
  done
}

hybridmem_backtrace() {  # $1 layout, $2 folder: the crash again with llama.cpp's log streamed, and its native stack
  local gdb; gdb=$(command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2> /dev/null)
  python3 -m bench.gpu.hybrid_memory --tokenizer .gpu/tokenizer.gguf --layouts "$1" --echo-log \
    --cases 2048x1 --out "$2/echo" > "$2/echo-$1.txt" 2>&1
  stamp "hybridmem $1 with the log streamed: exit $?"; grep -v "llama_model_loader: - \|print_info" "$2/echo-$1.txt" | tail -25
  [[ -n $gdb ]] || { stamp "no cuda-gdb"; return; }
  [[ -f $2/gdb.done ]] && return  # one native stack is enough device time
  touch "$2/gdb.done"
  timeout 180 "$gdb" -q -batch -ex run -ex bt -ex "info threads" --args python3 -m bench.gpu.hybrid_memory \
    --tokenizer .gpu/tokenizer.gguf --layouts "$1" --cases 2048x1 --out "$2/gdb" > "$2/gdb-$1.txt" 2>&1
  stamp "hybridmem $1 under cuda-gdb: exit $?"; grep -A30 "SIGSEGV" "$2/gdb-$1.txt" | head -40
}

step_depth() {  # issue 41: N new tokens after D cached vs from position 0, the engine alone, KV q8_0 and f16
  local out=$S/out/$(date -u +%F)-prefill-depth-gpu kv m rc=0
  mkdir -p "$out"
  hold 16160
  for m in 7b 8b; do
    [[ -f $G/gguf/$m-q4_k_m.gguf ]] || continue
    for kv in q8_0 f16; do
      python3 -m bench.prefill_depth --model "$G/gguf/$m-q4_k_m.gguf" --gpu --kv $kv --ctx 10240 --out "$out/$m-$kv" \
        > "$out/output-$m-$kv.txt" 2>&1 || rc=$?
    done
  done
  stamp "depth gguf exit $rc"
  cat "$out"/*/prefill-depth.md
  release
}

step_turns() {  # $1: gguf
  local out=$S/out/$(date -u +%F)-turn-overhead-$1 spy
  spy=$(command -v py-spy || ls /tmp/site2/bin/py-spy 2> /dev/null)
  hold 16160
  python3 -m bench.turn_overhead --out "$out" --config bench/gpu/configs/session-gguf-7b.yaml ${spy:+--py-spy "$spy"}
  stamp "turns $1 exit $?"
  release
}

gw=
gateway_up() {  # $1 config, $2 log: `voltgate serve` planned for one V100-32GB, its pid in $gw, waited for /ready
  python3 -m gateway serve --config "$1" --gpus v100-32gb > "$2" 2>&1 &
  gw=$!
  for _ in $(seq 1 300); do curl -sf http://127.0.0.1:8000/ready > /dev/null && break; kill -0 $gw || break; sleep 1; done
}

step_reasoning_tm() {  # issue 36: LMDeploy's reasoning parser, picked by the plan, on chat, Responses and Messages
  local out=$S/out/$(date -u +%F)-tm-reasoning
  mkdir -p "$out"
  python3 -m bench.gpu.tm_reasoning make "$G/models/7b" "$G/models/7b-think"
  hold 32510
  gateway_up bench/gpu/configs/tm-think-7b.yaml "$out/gateway.log"
  python3 -m bench.gpu.tm_reasoning check --model think --out "$out/reasoning.jsonl"
  stamp "reasoning tm exit $?"
  grep -o -- '--reasoning-parser [a-z0-9-]*' "$out/gateway.log" | head -1
  kill -TERM $gw; wait $gw 2> /dev/null
  release
}

step_split_tm() {  # issue 41: where a TurboMind cached turn's time goes (bench.gpu.tm_turn_split), the 8B, 32 GB
  local out=$S/out/$(date -u +%F)-tm-turn-split port
  [[ -d $out ]] && out=$out-2  # a second run in the same call (e.g. once the llama.cpp build is done)
  mkdir -p "$out"
  hold 32510
  gateway_up bench/gpu/configs/session-tm-8b.yaml "$out/gateway.log"
  port=$(grep -o -- '--server-port [0-9]*' "$out/gateway.log" | head -1 | awk '{print $2}')
  python3 -m bench.gpu.tm_turn_split --model-path "$G/models/8b" --model llama3-8b --lmdeploy-url "http://127.0.0.1:$port" \
    --gateway-url http://127.0.0.1:8000 --out "$out" > "$out/output.txt" 2>&1
  stamp "split tm8b exit $? (LMDeploy on port $port)"
  tail -12 "$out/output.txt"
  kill -TERM $gw; wait $gw 2> /dev/null
  release
}

step_moe_tm() {  # issue 39: a random-weight Qwen3-MoE on TurboMind, the plan's sizing and speed against the run
  # $1 = bf16: the weights served as BF16 (`--dtype bfloat16` through the config's extra_args): TurboMind 0.18 has
  # no grouped FP16 GEMM on sm_90 (docs/placement.md, "Families"), so the H100/H200 runs the experts in BF16, the
  # same bytes per weight as the FP16 a V100 (sm_70, which has that kernel family) would run
  local out=$S/out/$(date -u +%F)-tm-moe${1:+-$1} name=tm-qwen3moe-32gb${1:+-$1}
  mkdir -p "$out"
  [[ -f $G/models/qwen3moe/made ]] || { python3 -m bench.gpu.make_moe_hf "$G/models/qwen3moe" > "$out/make_moe_hf.log" 2>&1 \
    && touch "$G/models/qwen3moe/made"; }
  tail -1 "$out/make_moe_hf.log"
  python3 -m bench.gpu.predict_vs_measure run --scenarios bench/gpu/configs/pvm-scenarios.yaml --only $name \
    --gpus auto --out-dir "$out" --hold-script .gpu/hold_memory.py --python python3 --commit "${VG_COMMIT:-unknown}" 2>&1 | tail -30
  stamp "moe tm exit $?"
}

step_replicas_tm() {  # issue 38: two replicas vs one worker, the same memory (a V100-32GB's), one H200's compute
  local out=$S/out/$(date -u +%F)-replicas-tm i=0
  mkdir -p "$out"
  [[ -f $G/models/1b/made ]] || { python3 .gpu/make_model.py "$G/models/1b" --shape 1b > "$out/make_model_1b.log" 2>&1 \
    && touch "$G/models/1b/made"; }
  hold 32510
  for n in 1 2 2 1; do
    i=$((i + 1))
    gateway_up "bench/gpu/configs/replicas-tm-1b-$n.yaml" "$out/gateway-$i-r$n.log"
    python3 -m bench.loadgen --base-url http://127.0.0.1:8000/v1 --model tiny --endpoint completions --prompt-tokens 128 \
      --output-tokens 256 --concurrency 16 32 64 --label "replicas-$n" --output "$out/loadgen-$i-r$n.json" \
      --notes "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) held to a V100-32GB's memory; random-weight TinyLlama-1.1B shape; $n TurboMind worker(s)" 2>&1 | tail -4
    curl -s http://127.0.0.1:8000/metrics | grep '^voltgate:replica_picks_total' > "$out/picks-$i-r$n.txt"
    kill -TERM $gw; wait $gw 2> /dev/null
  done
  stamp "replicas tm done"
  release
}

stamp "start; commit ${VG_COMMIT:-$(git rev-parse --short HEAD 2> /dev/null || echo unknown)}; steps ${STEPS:-default}"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
export PYTHONPATH=$PWD:/tmp/site2:${PYTHONPATH:-} PYTHONUNBUFFERED=1 PATH=/tmp/bin:$PATH
SERVER=$G/build-server/bin/llama-server
[[ ${ONE_BUILD:-} == 1 ]] && export LLAMA_CPP_LIB_PATH=$G/build-server/bin MTMD_CPP_LIB=$G/build-server/bin
# a second run on a warm machine (rm /tmp/regress/started first) may leave `setup` out: the environment it made
[[ -f $G/env.sh ]] && source "$G/env.sh"
for step in ${STEPS:-setup model gguf server bench}; do
  stamp "$step (code: $(cat bench/gpu/.tree 2> /dev/null || echo "${VG_COMMIT:-unknown}"))"
  case $step in
    setup) step_setup ;;
    model) step_model ;;
    gguf) step_gguf ;;
    gguf8b) step_gguf8b > "$S/gguf8b.log" 2>&1; tail -4 "$S/gguf8b.log" ;;
    server) step_server ;;
    bench) step_bench "" ${REGRESS_ARGS:-} ;;
    bench:*) pairs=${step#bench:}; step_bench "${pairs%%,*}" --only ${pairs//,/ } ${PAIR_ARGS:-} ;;
    sessions:*) step_sessions "${step#sessions:}" ;;
    turns:gguf) step_turns gguf ;;
    hybrid:gguf) step_hybrid ;;
    hybridmem:gguf) step_hybridmem ;;
    depth:gguf) step_depth ;;
    reasoning:tm) step_reasoning_tm ;;
    replicas:tm) step_replicas_tm ;;
    moe:tm) step_moe_tm ;;
    moe:tm-bf16) step_moe_tm bf16 ;;
    split:tm8b) step_split_tm ;;
    moegguf) step_moegguf ;;
    moediag) step_moediag ;;
    pvm:*) step_pvm "${step#pvm:}" ;;
    *) stamp "unknown step $step" ;;
  esac
  [[ -f $G/env.sh ]] && source "$G/env.sh"
done
cp "$S"/*.log "$S/out/" 2> /dev/null
touch "$S/done"
