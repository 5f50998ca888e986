"""ON THE GPU MACHINE: which way of loading a GGUF with our `native.Model` crashes (the SIGSEGV of 2026-12-01)?

    python3 -m bench.gpu.diag_threads GGUF [--n-gpu-layers N]

Each variant runs in its own process (a crash ends only that one) with `PYTHONFAULTHANDLER=1`; one line per
variant: its exit code and the last lines of its output. The variants differ in one thing each: main thread or
a `threading.Thread`, the thread's stack size, whether our log forwarder is installed, whether the backend was
initialised on the main thread first, and whether the worker's own imports (uvloop, uvicorn) are loaded.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys

_CHILD = r"""
import sys, threading, ctypes
variant, path, ngl = sys.argv[1], sys.argv[2], int(sys.argv[3])
if "imports" in variant:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        print("no uvloop here", flush=True)
    import uvicorn  # noqa: F401
    import backends.llamacpp.worker.chat_server  # noqa: F401
from backends.llamacpp.worker import native
if "nolog" in variant:
    native.lib.llama_backend_init()
    native._log_forwarder = object()  # init_backend() becomes a no-op: llama.cpp keeps its own log
elif "maininit" in variant:
    native.init_backend()
if "stack64" in variant:
    threading.stack_size(64 << 20)
opts = native.ContextOptions(n_ctx_per_seq=256, n_seq_max=2, n_gpu_layers=ngl)
def load():
    m = native.Model(__import__("pathlib").Path(path), opts)
    print("loaded: n_vocab", m.n_vocab, "n_ctx_seq", m.n_ctx_seq, flush=True)
    m.close()
if "thread" in variant:
    t = threading.Thread(target=load, name="model-loader"); t.start(); t.join()
else:
    load()
print("ok", flush=True)
"""

VARIANTS = (
    "main",
    "main-nolog",
    "main-imports",
    "thread",
    "thread-nolog",
    "thread-stack64",
    "thread-maininit",
    "thread-maininit-stack64-imports",
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("gguf")
    parser.add_argument("--n-gpu-layers", type=int, default=-1)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    print(f"RLIMIT_STACK soft={soft} hard={hard}; python {sys.version.split()[0]}; pid {os.getpid()}", flush=True)
    env = dict(os.environ, PYTHONFAULTHANDLER="1", PYTHONUNBUFFERED="1")
    for variant in VARIANTS:
        try:
            done = subprocess.run(
                [sys.executable, "-c", _CHILD, variant, args.gguf, str(args.n_gpu_layers)],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
            )
            rc, out = done.returncode, (done.stdout + done.stderr)
        except subprocess.TimeoutExpired as exc:
            rc, out = 124, str(exc.stdout or "") + str(exc.stderr or "")
        lines = [line for line in out.splitlines() if line.strip() and not line.startswith("llama_model_loader: -")]
        print(f"== {variant}: rc {rc}", flush=True)
        shown = lines[-12:] if rc else [line for line in lines if line.startswith(("loaded:", "ok", "no uvloop"))]
        for line in shown:
            print(f"   {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
