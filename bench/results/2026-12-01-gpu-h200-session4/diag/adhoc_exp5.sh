source /tmp/gpu/env.sh; export PYTHONPATH=$PWD:/tmp/site2:$PYTHONPATH PYTHONFAULTHANDLER=1 PYTHONUNBUFFERED=1
T=/tmp/gpu/tiny.gguf
W="--model-name t --port 9100 --max-queue 8 --model $T --ctx 256 --slots 2 --n-gpu-layers -1"
v() { local name=$1; shift; timeout 60 python3 -c "$@" > /tmp/o.txt 2>&1; echo "== $name: rc $? $(grep -m1 -o 'loaded.*\|Segmentation fault' /tmp/o.txt)"; }
H="import sys, pathlib; from backends.llamacpp import worker, native
hand = native.ContextOptions(n_ctx_per_seq=256, n_seq_max=2, n_gpu_layers=-1)"
v f-argv-no-parse "$H
m = native.Model(pathlib.Path('$T'), hand); print('loaded f')" $W
v g-no-argv "$H
m = native.Model(pathlib.Path('$T'), hand); print('loaded g')"
v h-parse-list-no-argv "$H
args = worker.build_parser().parse_args('$W'.split())
m = native.Model(pathlib.Path('$T'), hand); print('loaded h')"
v i-argv-one "$H
m = native.Model(pathlib.Path('$T'), hand); print('loaded i')" x
v j-argv-sysargv-cleared "$H
sys.argv[:] = sys.argv[:1]
m = native.Model(pathlib.Path('$T'), hand); print('loaded j')" $W
v k-print-before "$H
print('x' * 10, flush=True)
m = native.Model(pathlib.Path('$T'), hand); print('loaded k')"
