set -u
source /tmp/gpu/env.sh; export PYTHONPATH=$PWD:/tmp/site2:$PYTHONPATH PYTHONFAULTHANDLER=1 PYTHONUNBUFFERED=1
T=/tmp/gpu/tiny.gguf
W="--model-name t --port 9100 --max-queue 8 --model $T --ctx 256 --slots 2 --n-gpu-layers -1"
run() { echo "== $1"; shift; timeout 40 "$@" > /tmp/exp.log 2>&1 & p=$!; sleep 12; curl -s -m 5 http://127.0.0.1:9100/health; echo; kill -TERM $p 2>/dev/null; wait $p; echo "rc $?"; grep -v '^\s*$' /tmp/exp.log | grep -v "^llama_model_loader: -" | head -14; }
run E-no-uvloop python3 -c "import sys; sys.modules['uvloop']=None; from backends.llamacpp.worker import main; sys.exit(main(sys.argv[1:]))" $W
run G-asyncio-loop-plus-thread python3 -c "
import asyncio, threading, pathlib
from backends.llamacpp import native
native.init_backend()
def load():
    m = native.Model(pathlib.Path('$T'), native.ContextOptions(n_ctx_per_seq=256, n_seq_max=2, n_gpu_layers=-1)); print('loaded', flush=True)
async def main():
    t = threading.Thread(target=load); t.start()
    while t.is_alive(): await asyncio.sleep(0.01)
asyncio.run(main())"
run H-uvloop-loop-plus-thread python3 -c "
import asyncio, threading, pathlib, uvloop
from backends.llamacpp import native
native.init_backend()
def load():
    m = native.Model(pathlib.Path('$T'), native.ContextOptions(n_ctx_per_seq=256, n_seq_max=2, n_gpu_layers=-1)); print('loaded', flush=True)
async def main():
    t = threading.Thread(target=load); t.start()
    while t.is_alive(): await asyncio.sleep(0.01)
uvloop.run(main())"
run I-worker-ngl0-cuda-hidden env CUDA_VISIBLE_DEVICES= python3 -m backends.llamacpp.worker $W
run J-worker-plain python3 -m backends.llamacpp.worker $W
