"""Embedding throughput of our llama.cpp worker (`--task embed`) on the CPU: inputs/s and tokens/s per batch size.

Starts the worker on `--model`, then sends requests of each batch size (inputs per request, default 1, 8,
64) one at a time, rotating through the sizes until `--seconds` have passed, and reports per size inputs/s
and prompt tokens/s (the worker's own `usage` counts) over the time its requests took, and request latency.
Inputs are distinct sentences of `--words` words, so no two inputs are the same.

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


async def _request(client: httpx.AsyncClient, texts: list[str]) -> tuple[float, int]:
    """One request's (latency in seconds, prompt tokens)."""
    started = time.perf_counter()
    response = await client.post("/v1/embeddings", json={"model": "bench-embed", "input": texts})
    latency = time.perf_counter() - started
    if response.status_code != 200:
        raise RuntimeError(f"embedding request failed: {response.status_code} {response.text[:300]}")
    return latency, int(response.json()["usage"]["prompt_tokens"])


async def _run(args: argparse.Namespace, root: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Rotate through the batch sizes until `--seconds` have passed (at least one cycle).

    A cycle sends, for each batch size b, `max(batch) / b` requests of b inputs, so every size embeds the
    same number of inputs per cycle and drift on a shared machine hits every size alike.
    """
    largest = max(args.batch)
    latencies: dict[int, list[float]] = {b: [] for b in args.batch}
    tokens = dict.fromkeys(args.batch, 0)
    offset = 0
    async with httpx.AsyncClient(base_url=root, timeout=600, trust_env=False) as client:
        for batch in args.batch:  # warm-up, not counted
            await _request(client, sentences(batch, args.words, offset))
            offset += batch
        before = (await client.get("/health")).json()
        started = time.perf_counter()
        cycles = 0
        while cycles == 0 or time.perf_counter() - started < args.seconds:
            for batch in args.batch:
                for _ in range(max(1, largest // batch)):
                    latency, n_tokens = await _request(client, sentences(batch, args.words, offset))
                    offset += batch
                    latencies[batch].append(latency)
                    tokens[batch] += n_tokens
            cycles += 1
        after = (await client.get("/health")).json()
    levels = []
    for batch in args.batch:
        busy_s = sum(latencies[batch])
        inputs = batch * len(latencies[batch])
        level = {
            "batch": batch,
            "requests": len(latencies[batch]),
            "inputs": inputs,
            "prompt_tokens": tokens[batch],
            "busy_seconds": round(busy_s, 3),
            "inputs_per_s": round(inputs / busy_s, 2),
            "tokens_per_s": round(tokens[batch] / busy_s, 1),
            "tokens_per_input": round(tokens[batch] / inputs, 1),
            "latency_ms": distribution(latencies[batch], scale=1000.0),
        }
        print(
            f"batch {batch:3d}: {level['inputs_per_s']:9.1f} inputs/s {level['tokens_per_s']:10.1f} tokens/s  "
            f"p50 {level['latency_ms']['p50']:8.1f} ms ({level['requests']} requests)"
        )
        levels.append(level)
    totals = {
        "cycles": cycles,
        "seconds": round(time.perf_counter() - started, 3),
        "worker_rounds": after["rounds_total"] - before["rounds_total"],
        "worker_health": after,
    }
    return totals, levels


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.embeddings", description=__doc__)
    p.add_argument("--model", required=True, type=Path, help="GGUF embedding model (or a decoder with --pooling)")
    p.add_argument("--pooling", choices=["mean", "cls", "last"], default=None, help="override the GGUF's pooling")
    p.add_argument("--out", required=True, type=Path, help="result JSON")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64], help="inputs per request")
    p.add_argument("--seconds", type=float, default=30.0, help="measured time, all batch sizes together")
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
        totals, levels = asyncio.run(_run(args, root))
    finally:
        proc.stop()
    load_after = os.getloadavg()
    result = provenance.collect(
        bench="embeddings",
        model=provenance.gguf_shape(args.model),
        worker={"argv": proc.argv},
        totals=totals,
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
