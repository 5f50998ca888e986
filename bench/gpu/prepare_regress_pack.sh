#!/usr/bin/env bash
# HERE, on a machine with PyPI access, from the repo root: the pack `make bench-gpu` carries to the GPU machine.
#   .gpu/            shared/gpu/* (the tested recipe: setup_device.sh, make_model.py, hold_memory.py, ...)
#   .gpu/pack/       shared/gpu/prepare_pack.sh's pack (LMDeploy 0.18 TurboMind, libcudart 12, llama-cpp-python
#                    0.3.36 stripped, the wheels the image lacks), about 21 MB
#   .gpu/pack/llama_server_src.tar.xz
#                    llama.cpp as vendored by llama-cpp-python 0.3.36, with tools/server, tools/mtmd and tools/ui's
#                    CMake files kept (prepare_pack.sh strips tools/), so run_regress.sh can build `llama-server`
#                    for sm_90: the reference the worker is held to, the same llama.cpp commit the worker runs
#   .gpu/tokenizer.gguf
#                    the embedded SmolLM2's tokenizer alone (bench/gpu/make_moe_gguf.py --tokenizer-only): the MoE
#                    GGUF's vocabulary, so run_regress.sh's `moegguf` step needs no other GGUF and runs beside the build
#   .gpu/site2.tar.xz
#                    the gateway's runtime packages for the image's Python 3.12, at this venv's versions (not openai:
#                    3.x breaks the pack's lmdeploy, bench/results/2026-12-03-gpu-turbomind/), and with PYSPY=1 py-spy, installed
#                    into site2/ and xz-compressed (bench/gpu/install_extra.sh unpacks it to /tmp/site2): 15.8 MB
#                    where the wheels were 22 MB, and a device call carries at most 64 MiB with the checkout
# `.gpu/` is git-ignored (.gitignore); a device call carries it with `carry: [".gpu"]`.
#
# Usage: PY=.venv/bin/python bash bench/gpu/prepare_regress_pack.sh [SHARED_GPU_DIR]   (default /work/shared/gpu)
set -euo pipefail
SHARED=${1:-/work/shared/gpu}
mkdir -p .gpu
cp -r "$SHARED"/* .gpu/
[[ -f .gpu/pack/llama_cpp_python.tar.xz ]] || bash .gpu/prepare_pack.sh .gpu/pack
PY=${PY:-.venv/bin/python}
PKGS="fastapi opentelemetry-api starlette uvicorn uvloop httptools httpx httpcore h11 anyio sniffio idna certifi
  pydantic pydantic-core pydantic-settings python-dotenv typing-extensions typing-inspection annotated-types
  prometheus-client nvidia-ml-py pyyaml typer click rich markdown-it-py mdurl pygments shellingham gguf
  safetensors psutil pillow tqdm importlib-metadata zipp"
# a package this venv lacks is skipped (`|| true`: under pipefail its failed `pip show` would end the script)
PINS=$(for p in $PKGS; do "$PY" -m pip show "$p" 2> /dev/null | awk -v n="$p" '/^Version:/ {print n "==" $2}' || true; done)
rm -rf .gpu/extra .gpu/site2.tar.xz && mkdir -p .gpu/extra
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .gpu/extra $PINS
# py-spy (PYSPY=1), for bench.turn_overhead's profile on the GPU machine (`turns:gguf`): a static binary,
# /tmp/site2/bin/py-spy, ~1.9 MB of the pack; left out by default, since the checkout and .gpu/ together must
# stay under a device call's 64 MiB and the results folders grow (2026-12-06: 66 MiB with it)
[[ ${PYSPY:-} == 1 ]] && python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .gpu/extra py-spy==0.4.3
SITE=$(mktemp -d)
python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --target "$SITE/site2" .gpu/extra/*.whl
XZ_OPT="-9 -T0" tar -cJf .gpu/site2.tar.xz -C "$SITE" site2 && rm -rf "$SITE" .gpu/extra
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
python3 -m pip download -q --no-deps --no-binary=:all: -d "$WORK" llama-cpp-python==0.3.36
tar -xzf "$WORK"/llama_cpp_python-0.3.36.tar.gz -C "$WORK"
V="$WORK/llama_cpp_python-0.3.36/vendor/llama.cpp"
rm -rf "$V/.git" "$V/.github" "$V/models" "$V/docs" "$V/media" "$V/tests" "$V/benches" "$V/examples" "$V/pocs" \
       "$V/app" "$V/ci" "$V/skills" "$V/gguf-py/tests"
for b in cann et hexagon metal opencl openvino sycl virtgpu vulkan webgpu zdnn zendnn; do rm -rf "$V/ggml/src/ggml-$b"; done
# tools/ui is the llama-ui target llama-server links (its web page); without npm or the network it builds
# with no page, so its sources and tests go and its CMake files stay
find "$V/tools" -mindepth 1 -maxdepth 1 -type d ! -name server ! -name mtmd ! -name ui -exec rm -rf {} +
rm -rf "$V/tools/ui/src" "$V/tools/ui/tests" "$V/tools/ui/static" "$V/tools/ui/package-lock.json"
printf 'add_subdirectory(mtmd)\nif (LLAMA_BUILD_SERVER)\n    add_subdirectory(ui)\n    add_subdirectory(server)\nendif()\n' > "$V/tools/CMakeLists.txt"
DEST=$PWD/.gpu/pack/llama_server_src.tar.xz
(cd "$(dirname "$V")" && XZ_OPT="-6 -T0" tar -cJf "$DEST" llama.cpp)
"$PY" -m bench.gpu.make_moe_gguf --tokenizer-only "$("$PY" -c 'from bench.launch import default_model_path as p; print(p())')" \
  .gpu/tokenizer.gguf
ls -la .gpu/pack; du -sh .gpu
