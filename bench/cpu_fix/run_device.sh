#!/usr/bin/env bash
# The AMX-crash fixes measured on the GPU machine's CPU (an AMX Xeon there), CPU-only llama.cpp builds.
#
# Carried: .gpu-cpu/ (made here by bench/cpu_fix/prepare.sh): the stripped llama-cpp-python 0.3.36 sdist,
# the embedded model's skeleton (metadata, tokenizer, tensor list) and the wheels the image lacks.
# Builds (CPU only, CMake + Ninja), each installed into its own lib folder:
#   native  - what `pip install llama-cpp-python` does on the host (GGML_NATIVE=ON: AMX compiled in on AMX CPUs)
#   noamx   - GGML_NATIVE=ON with -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 (every other native feature kept)
#   avx512  - GGML_NATIVE=OFF with explicit AVX-512 flags (the build the issue reported as working)
# Then a random-weight copy of the embedded model (same shapes and quant types), requantised to Q4_K_M and
# Q4_0, and bench.cpu_fix.speed over builds x use_extra_bufts x models x threads.
#
#   bash bench/cpu_fix/run_device.sh [STEPS]     STEPS: any of build,models,serve,bench (default all)
set -euo pipefail
STEPS=${1:-build,models,serve,bench}
P=$PWD/.gpu-cpu
G=/tmp/cpufix
OUT=${OUT:-/tmp/cpufix-out}
mkdir -p "$G" "$OUT"
export PYTHONUNBUFFERED=1
lscpu > "$OUT/lscpu.txt"
grep -o 'amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ' > "$OUT/amx_flags.txt" || true
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo)  amx: $(cat "$OUT/amx_flags.txt")  stack: $(ulimit -s)"
if [[ -n ${STACK:-} ]]; then ulimit -s "$STACK"; echo "stack limit set to $(ulimit -s)"; fi

if [[ ! -d $G/site ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$G/site" "$P"/whl/*.whl
    python3 -m tarfile -e "$P/llama_cpp_python.tar.xz" "$G/src"
fi
S=$G/src/llama_cpp_python-0.3.36
export PYTHONPATH=$PWD:$G/site:$S:$S/vendor/llama.cpp/gguf-py

build() {  # NAME CMAKE_ARGS...
    local name=$1; shift
    [[ -f $G/lib-$name/libllama.so ]] && return
    local t0=$SECONDS
    cmake -S "$S" -B "$G/build-$name" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAVA_BUILD=OFF \
        -DSKBUILD_PLATLIB_DIR="$G/platlib" "$@" > "$G/cmake-$name.log"
    cmake --build "$G/build-$name" -j "$(nproc)" > "$G/ninja-$name.log"
    rm -rf "$S/llama_cpp/lib"
    cmake --install "$G/build-$name" > /dev/null
    mkdir -p "$G/lib-$name" && cp -a "$S"/llama_cpp/lib/* "$G/lib-$name/"
    echo "build $name: $((SECONDS - t0)) s"
}

if [[ $STEPS == *build* ]]; then
    NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    build native
    build noamx "-DCMAKE_C_FLAGS=$NOAMX" "-DCMAKE_CXX_FLAGS=$NOAMX"
    build avx512 -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
        -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
    for b in native noamx avx512; do
        LLAMA_CPP_LIB_PATH=$G/lib-$b python3 -c "import llama_cpp; print('$b', llama_cpp.llama_print_system_info().decode())"
    done | tee "$OUT/system_info.txt"
fi

if [[ $STEPS == *pipbuild* ]]; then
    # The Makefile's own route on this AMX host: pip + scikit-build-core with the CMAKE_ARGS the Makefile
    # computes here (AMX left out); then the build's summary must show no AMX_INT8.
    ARGS=$(make -s --no-print-directory --eval 'show: ; @echo "$(LLAMA_CMAKE_ARGS)"' show 2>/dev/null || true)
    echo "Makefile CMAKE_ARGS on this host: $ARGS" | tee "$OUT/pipbuild.txt"
    t0=$SECONDS
    CMAKE_ARGS="$ARGS -DLLAVA_BUILD=OFF" python3 -m pip install -q --no-build-isolation --no-deps --no-index \
        --target "$G/pipbuild" "$S" > "$G/pipbuild.log" 2>&1 || tail -20 "$G/pipbuild.log"
    echo "pip build: $((SECONDS - t0)) s" | tee -a "$OUT/pipbuild.txt"
    LLAMA_CPP_LIB_PATH=$G/pipbuild/llama_cpp/lib python3 -c "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())" \
        | tee -a "$OUT/pipbuild.txt"
    mkdir -p "$G/lib-pip" && cp -a "$G"/pipbuild/llama_cpp/lib/* "$G/lib-pip/"
fi

M=$G/models
if [[ $STEPS == *models* ]]; then
    mkdir -p "$M"
    # Made here by bench/cpu_fix/prepare.sh (random_clone build, then xz); building it on the GPU machine
    # gave a file whose tokenizer crashed llama.cpp at load there (every build alike), so it travels made.
    [[ -f $M/q4_1.gguf ]] || python3 -c "import lzma, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2], 'wb') as dst: shutil.copyfileobj(src, dst)" \
        "$P/q4_1.gguf.xz" "$M/q4_1.gguf"
    for q in Q4_K_M Q4_0; do
        f=$M/$(echo $q | tr A-Z a-z).gguf
        [[ -f $f ]] || LLAMA_CPP_LIB_PATH=$G/lib-noamx python3 -m bench.cpu_fix.quantize "$M/q4_1.gguf" "$f" $q > /dev/null 2>&1
    done
    ls -la "$M"
fi

if [[ $STEPS == *preload* ]]; then
    # The image's python3 may bring its own C++ runtime: try the system's libstdc++/libgcc_s first in line.
    ldd "$G/lib-native/libllama.so" | grep -E 'stdc|gcc_s' | tee "$OUT/ldd.txt" || true
    python3 -c 'import sys; print(sys.executable, sys.version)' | tee -a "$OUT/ldd.txt"
    SYS="$(ldconfig -p | awk '/libstdc\+\+.so.6 /{print $NF; exit}'):$(ldconfig -p | awk '/libgcc_s.so.1 /{print $NF; exit}')"
    for pre in "" "$SYS"; do
        if LD_PRELOAD=$pre LLAMA_CPP_LIB_PATH=$G/lib-avx512 timeout 60 python3 -m backends.llamacpp.selftest \
            --model "$M/q4_1.gguf" --extra-bufts off; then export LD_PRELOAD=$pre; break; fi
    done
    echo "LD_PRELOAD=${LD_PRELOAD:-} (the first that decodes)" | tee -a "$OUT/ldd.txt"
fi

if [[ $STEPS == *bench* ]]; then
    python3 -m bench.cpu_fix.speed --out "$OUT" \
        --lib native=$G/lib-native --lib noamx=$G/lib-noamx --lib avx512=$G/lib-avx512 ${EXTRA_LIBS:-} \
        --model q4_1=$M/q4_1.gguf ${EXTRA_MODELS:---model q4_k_m=$M/q4_k_m.gguf} \
        --threads 4 --threads 16 --prompt-tokens 256 --gen-tokens 64 --repeats ${REPEATS:-3}
fi

if [[ $STEPS == *serve* ]]; then
    # The real gateway and workers on the native (AMX) build with the automatic setting: chat, stream, embed.
    cat > "$G/serve.yaml" <<YAML
server: {host: 127.0.0.1, port: 18431}
gpus: none
models:
  - {name: smollm2-135m, sources: [{gguf: "$G/models/q4_1.gguf"}], context: 2048, concurrency: 2}
  - {name: smollm2-embed, sources: [{gguf: "$G/models/q4_1.gguf"}], task: embed, pooling: mean, context: 512}
YAML
    LLAMA_CPP_LIB_PATH=$G/lib-native python3 -m gateway serve --config "$G/serve.yaml" > "$OUT/serve.log" 2>&1 &
    pid=$!
    for _ in $(seq 120); do curl -sf localhost:18431/ready > /dev/null && break; sleep 1; done
    body='{"model":"smollm2-135m","max_tokens":24,"messages":[{"role":"user","content":"The capital of France is a city that"}]}'
    { echo "== chat"; curl -s localhost:18431/v1/chat/completions -H 'content-type: application/json' -d "$body"
      echo; echo "== stream"; curl -sN localhost:18431/v1/chat/completions -H 'content-type: application/json' \
        -d "${body%\}},\"stream\":true}" | tail -3
      echo "== embed"; curl -s localhost:18431/v1/embeddings -H 'content-type: application/json' \
        -d '{"model":"smollm2-embed","input":["a sentence with several tokens in it","another one"]}' | head -c 300
      echo; echo "== ready"; curl -s localhost:18431/ready; echo; } | tee "$OUT/serve_requests.txt"
    kill $pid; wait $pid || true
    grep -i "extra buffer\|signal\|crash" "$OUT/serve.log" | head -20 || true
fi

if [[ $STEPS == *doctor* ]]; then
    # `voltgate doctor` on a real NVIDIA host (NVML, driver, the GPU), with the AMX build and the pip build.
    for b in native pip; do
        LLAMA_CPP_LIB_PATH=$G/lib-$b python3 -m gateway doctor --config "$G/serve.yaml" --gpus auto \
            > "$OUT/doctor-$b.txt" 2>&1 || true
    done
    LLAMA_CPP_LIB_PATH=$G/lib-native python3 -m gateway doctor --config "$G/serve.yaml" --gpus auto --json \
        > "$OUT/doctor-native.json" 2>&1 || true
    cat "$OUT/doctor-native.txt"
fi

if [[ $STEPS == *diag* ]]; then
    # Where a probe dies: Python's stack (faulthandler), llama.cpp's own log (verbose Llama), gdb's backtrace.
    for b in ${DIAG_BUILDS:-native avx512}; do
        for s in on off; do
            echo "=== $b extra_bufts=$s (faulthandler)"
            LLAMA_CPP_LIB_PATH=$G/lib-$b timeout 120 python3 -X faulthandler -m backends.llamacpp.selftest --probe \
                --json --model "$M/q4_1.gguf" --extra-bufts $s 2>&1 | tail -25 || true
        done
        echo "=== $b six-line Llama() verbose"
        LLAMA_CPP_LIB_PATH=$G/lib-$b timeout 120 python3 -X faulthandler -c "
from llama_cpp import Llama
m = Llama(model_path='$M/q4_1.gguf', n_ctx=256, verbose=True)
print(m.create_completion('The capital of France is', max_tokens=4))" 2>&1 | tail -30 || true
    done
    if command -v gdb > /dev/null; then
        echo "=== gdb native on"
        LLAMA_CPP_LIB_PATH=$G/lib-native timeout 180 gdb -q -batch -ex run -ex bt --args python3 -m \
            backends.llamacpp.selftest --probe --json --model "$M/q4_1.gguf" --extra-bufts on 2>&1 | tail -30 || true
    fi
fi
