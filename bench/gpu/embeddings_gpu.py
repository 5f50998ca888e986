"""bench/embeddings.py on the GPU: the same client and levels, with the worker's layers on the GPU.

bench.embeddings starts the worker with CUDA hidden (`CUDA_VISIBLE_DEVICES=""`) and no `--n-gpu-layers`, for
its CPU numbers; this runs its `main` with a worker that sees the GPU and gets `--n-gpu-layers` (default -1,
every layer). All other options are bench.embeddings' own.

    python3 -m bench.gpu.embeddings_gpu [--n-gpu-layers -1] --model bert.gguf --seconds 20 --out OUT.json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bench import embeddings
from bench.processes import ManagedProcess, free_port, python


def main(argv: Sequence[str] | None = None) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--n-gpu-layers", type=int, default=-1)
    ours, rest = pre.parse_known_args(argv)

    def start_worker(args: argparse.Namespace, log_dir: Path) -> tuple[ManagedProcess, str]:
        port = free_port()
        argv = [
            python(), "-m", "backends.llamacpp.worker", "--task", "embed",
            "--model", str(args.model), "--model-name", "bench-embed", "--host", "127.0.0.1", "--port", str(port),
            "--ctx", str(args.ctx), "--slots", str(args.slots), "--n-batch", str(args.n_batch),
            "--n-gpu-layers", str(ours.n_gpu_layers),
        ]  # fmt: skip
        if args.pooling:
            argv += ["--pooling", args.pooling]
        if args.n_threads:
            argv += ["--n-threads", str(args.n_threads)]
        proc = ManagedProcess("embed-worker", argv, log_dir=log_dir).start()
        root = f"http://127.0.0.1:{port}"
        try:
            proc.wait_http(f"{root}/health", 180)
        except BaseException:
            proc.stop()
            raise
        return proc, root

    embeddings.start_worker = start_worker
    return embeddings.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
