source /tmp/gpu/env.sh; export PYTHONPATH=$PWD:/tmp/site2:$PYTHONPATH PYTHONFAULTHANDLER=1 PYTHONUNBUFFERED=1
T=/tmp/gpu/tiny.gguf
W="--model-name t --port 9100 --max-queue 8 --model $T --ctx 256 --slots 2 --n-gpu-layers -1"
v() { local name=$1; shift; timeout 60 python3 -c "$@" > /tmp/o.txt 2>&1; echo "== $name: rc $? $(grep -m1 -o 'loaded.*\|Segmentation fault' /tmp/o.txt)"; }
P="import sys, pathlib, dataclasses; from backends.llamacpp import worker, native
args = worker.build_parser().parse_args(sys.argv[1:]); spec = worker.spec_from_args(args); hand = native.ContextOptions(n_ctx_per_seq=256, n_seq_max=2, n_gpu_layers=-1)
print(spec.context, hand, repr(spec.model_path), type(spec.context.n_gpu_layers), flush=True)
"
v a-spec "$P
m = native.Model(spec.model_path, spec.context); print('loaded a')" $W
v b-hand "$P
m = native.Model(pathlib.Path('$T'), hand); print('loaded b')" $W
v c-spec-ctx-hand-path "$P
m = native.Model(pathlib.Path('$T'), spec.context); print('loaded c')" $W
v d-hand-threads8 "$P
m = native.Model(pathlib.Path('$T'), dataclasses.replace(hand, n_threads=8)); print('loaded d')" $W
v e-spec-path-hand-ctx "$P
m = native.Model(spec.model_path, hand); print('loaded e')" $W
head -3 /tmp/o.txt; ls /tmp/site2 | head -40; python3 -c "import llama_cpp, numpy; print(llama_cpp.__file__, numpy.__file__)"
