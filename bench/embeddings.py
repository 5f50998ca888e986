"""Embedding throughput of our llama.cpp worker (`--task embed`) on the CPU: inputs/s and tokens/s per batch size.

Starts the worker on `--model`, then for each batch size (inputs per request, default 1, 8, 64) sends
requests for `--seconds` from `--concurrency` clients and reports inputs/s, prompt tokens/s (the worker's
own `usage` counts), request latency and the worker's forward-pass rounds. Inputs are distinct sentences of
`--words` words, so no two inputs are the same.

    python -m bench.embeddings --model PATH [--pooling mean] --out bench/results/<date>-cpu/embeddings.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench import provenance
from bench.processes import ManagedProcess, free_port, python
from bench.stats import distribution

_WORD_TEXT = (
    "the a cat dog sat on mat revenue grew by percent quarter market price river mountain city road rain "
    "music film book school teacher computer data model language learning network paris france capital"
)
_WORDS = _WORD_TEXT.split()


def sentences(n: int, words: int, offset: int = 0) -> list[str]:
    """`n` distinct sentences of `words` words (a counter spelled in words keeps them apart)."""
    out = []
    for i in range(offset, offset + n):
        picks = [_WORDS[(i * 7 + j * 13 + (i // len(_WORDS)) * j) % len(_WORDS)] for j in range(words - 1)]
        out.append(" ".join([*picks, str(i)]))
    return out


def start_worker(args: argparse.Namespace, log_dir: Path) -> tuple[ManagedProcess, str]:
    port = free_port()
    argv = [
        python(), "-m", "backends.llamacpp.worker", "--task", "embed",
        "--model", str(args.model), "--model-name", "bench-embed", "--host", "127.0.0.1", "--port", str(port),
        "--ctx", str(args.ctx), "--slots", str(args.slots), "--n-batch", str(args.n_batch),
    ]  # fmt: skip
    if args.pooling:
        argv += ["--pooling", args.pooling]
    if args.n_threads:
        argv += ["--n-threads", str(args.n_threads)]
    proc = ManagedProcess("embed-worker", argv, log_dir=log_dir, env={"CUDA_VISIBLE_DEVICES": ""}).start()
    root = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(f"{root}/health", 180)
    except BaseException:
        proc.stop()
        raise
    return proc, root


async def _level(client: httpx.AsyncClient, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    counter = 0
    latencies: list[float] = []
    inputs = tokens = errors = 0

    async def one() -> None:
        nonlocal counter, inputs, tokens, errors
        texts = sentences(batch, args.words, counter)
        counter += batch
        started = time.perf_counter()
        response = await client.post("/v1/embeddings", json={"model": "bench-embed", "input": texts})
        if response.status_code != 200:
            errors += 1
            return
        latencies.append(time.perf_counter() - started)
        inputs += batch
        tokens += int(response.json()["usage"]["prompt_tokens"])

    for _ in range(2):  # warm-up, not counted
        await one()
    latencies.clear()
    inputs = tokens = errors = 0
    before = (await client.get("/health")).json()
    started = time.perf_counter()
    deadline = started + args.seconds

    async def loop() -> None:
        while time.perf_counter() < deadline or not latencies:
            await one()

    await asyncio.gather(*(loop() for _ in range(args.concurrency)))
    elapsed = time.perf_counter() - started
    after = (await client.get("/health")).json()
    return {
        "batch": batch,
        "concurrency": args.concurrency,
        "requests": len(latencies),
        "errors": errors,
        "inputs": inputs,
        "prompt_tokens": tokens,
        "seconds": round(elapsed, 3),
        "inputs_per_s": round(inputs / elapsed, 2),
        "tokens_per_s": round(tokens / elapsed, 1),
        "tokens_per_input": round(tokens / inputs, 1) if inputs else None,
        "latency_ms": distribution(latencies, scale=1000.0),
        "worker_rounds": after["rounds_total"] - before["rounds_total"],
    }


async def _run(args: argparse.Namespace, root: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    async with httpx.AsyncClient(base_url=root, timeout=600, trust_env=False) as client:
        health = (await client.get("/health")).json()
        levels = []
        for batch in args.batch:
            level = await _level(client, batch, args)
            print(
                f"batch {batch:3d} x{args.concurrency}: {level['inputs_per_s']:9.1f} inputs/s "
                f"{level['tokens_per_s']:10.1f} tokens/s  p50 {level['latency_ms']['p50']:8.1f} ms "
                f"({level['requests']} requests, {level['worker_rounds']} rounds)"
            )
            levels.append(level)
        return health, levels


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.embeddings", description=__doc__)
    p.add_argument("--model", required=True, type=Path, help="GGUF embedding model (or a decoder with --pooling)")
    p.add_argument("--pooling", choices=["mean", "cls", "last"], default=None, help="override the GGUF's pooling")
    p.add_argument("--out", required=True, type=Path, help="result JSON")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64], help="inputs per request")
    p.add_argument("--concurrency", type=int, default=1, help="clients sending requests at once")
    p.add_argument("--seconds", type=float, default=10.0, help="measured time per batch size")
    p.add_argument("--words", type=int, default=24, help="words per input")
    p.add_argument("--ctx", type=int, default=512, help="worker --ctx: the longest input")
    p.add_argument("--slots", type=int, default=64, help="worker --slots: inputs per forward pass")
    p.add_argument("--n-batch", type=int, default=512, help="worker --n-batch: tokens per forward pass")
    p.add_argument("--n-threads", type=int, default=None, help="worker CPU threads (default: its own)")
    p.add_argument("--log-dir", type=Path, default=Path("bench/out"))
    args = p.parse_args(argv)

    load_before = os.getloadavg()
    proc, root = start_worker(args, args.log_dir)
    try:
        health, levels = asyncio.run(_run(args, root))
    finally:
        proc.stop()
    load_after = os.getloadavg()
    result = provenance.collect(
        bench="embeddings",
        model=provenance.gguf_shape(args.model),
        worker={"argv": proc.argv, "health": health},
        settings={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        levels=levels,
        # The machine may be shared: 1/5/15-minute load averages before and after the run.
        load_average={"before": load_before, "after": load_after},
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
