set -u
source /tmp/gpu/env.sh; export PYTHONPATH=$PWD:/tmp/site2:$PYTHONPATH PYTHONFAULTHANDLER=1 PYTHONUNBUFFERED=1
T=/tmp/gpu/tiny.gguf
which gdb lldb catchsegv; python3 -c "import uvicorn, starlette, numpy; print(uvicorn.__version__, starlette.__version__, numpy.__version__)"
W="--model-name t --port 9100 --max-queue 8 --model $T --ctx 256 --slots 2 --n-gpu-layers -1"
run() { echo "== $1"; shift; timeout 40 "$@" > /tmp/exp.log 2>&1 & p=$!; sleep 10; curl -s -m 5 http://127.0.0.1:9100/health; echo; kill -TERM $p 2>/dev/null; wait $p; echo "rc $?"; grep -v '^\s*$' /tmp/exp.log | grep -v "^llama_model_loader: -" | head -12; }
PRE="import sys, threading
from backends.llamacpp import worker, native, server
args = worker.build_parser().parse_args(sys.argv[1:]); spec = worker.spec_from_args(args)
"
run K-state-load-thread python3 -c "$PRE
native.init_backend(); st = server._WorkerState(spec, print); t = threading.Thread(target=st.load); t.start(); t.join(); print('engine', st.engine)" $W
run L-state-load-main python3 -c "$PRE
native.init_backend(); st = server._WorkerState(spec, print); st.load(); print('engine', st.engine)" $W
run M-model-spec-thread python3 -c "$PRE
native.init_backend(); t = threading.Thread(target=lambda: print('model', native.Model(spec.model_path, spec.context))); t.start(); t.join()" $W
run N-worker-nolog python3 -c "import sys; from backends.llamacpp import native, worker; native.lib.llama_backend_init(); native._log_forwarder = object(); sys.exit(worker.main(sys.argv[1:]))" $W
run O-worker-nostack python3 -c "import sys, threading; threading.stack_size = lambda *a: 0; from backends.llamacpp import worker; sys.exit(worker.main(sys.argv[1:]))" $W
run P-worker-configure-logging-off python3 -c "import sys; from backends.llamacpp import worker; worker._configure_logging = lambda: None; sys.exit(worker.main(sys.argv[1:]))" $W
