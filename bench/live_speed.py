"""Predicted against measured on live traffic (issue #16): what `GET /v1/placement` says after real requests.

Starts `voltgate serve` on one llama.cpp model (the embedded SmolLM2 by default, on the CPU), sends streamed
chats one at a time and then `--concurrency` at once through the openai SDK, and writes the model's
`prediction` and `measured` objects from /v1/placement, with the bench's own client-side decode speed beside
them (the same definition: tokens after the first over first to last content chunk).

    python -m bench.live_speed --output bench/results/<date>-cpu/live-speed.json [--n-threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import openai

from bench import launch, provenance
from bench.processes import free_port
from bench.report import live_speed_table
from bench.stats import RequestRecord, median

MODEL = "smollm2-135m"
PROMPT = "Write a short story about a lighthouse keeper."


async def _stream(client: openai.AsyncOpenAI, max_tokens: int) -> float | None:
    """One streamed chat; its decode tokens/s as the gateway measures it (content chunks after the first over
    first to last content chunk), None with fewer than 2."""
    started = time.perf_counter()
    stream = await client.chat.completions.create(
        model=MODEL, stream=True, max_tokens=max_tokens, messages=[{"role": "user", "content": PROMPT}]
    )
    times = [time.perf_counter() async for chunk in stream if chunk.choices and chunk.choices[0].delta.content]
    if not times:
        return None
    record = RequestRecord(index=0, ttft_s=times[0] - started, e2e_s=times[-1] - started, output_tokens=len(times))
    return record.decode_tok_s


async def _load(root: str, *, sequential: int, concurrency: int, max_tokens: int) -> dict[str, Any]:
    client = openai.AsyncOpenAI(base_url=root + "/v1", api_key=launch.BENCH_API_KEY, max_retries=0)
    alone = [await _stream(client, max_tokens) for _ in range(sequential)]
    together = await asyncio.gather(*[_stream(client, max_tokens) for _ in range(concurrency)])
    headers = {"authorization": f"Bearer {launch.BENCH_API_KEY}"}
    async with httpx.AsyncClient(timeout=30) as http:
        placement = (await http.get(root + "/v1/placement", headers=headers)).json()
    decision = next(d for d in placement["decisions"] if d.get("name", d.get("model")) == MODEL)

    def p50(values: Sequence[float | None]) -> float | None:
        found = median(v for v in values if v is not None)
        return round(found, 1) if found is not None else None

    return {
        "client_decode_tok_s_p50": {"alone": p50(alone), f"{concurrency}_at_once": p50(together)},
        "prediction": decision.get("prediction"),
        "measured": decision.get("measured"),
    }


def run(
    model_path: Path,
    log_dir: Path,
    *,
    n_threads: int | None = 1,
    context: int = 4096,
    slots: int = 4,
    sequential: int = 8,
    concurrency: int = 4,
    max_tokens: int = 128,
) -> dict[str, Any]:
    """Start the gateway, send the load, and answer the settings, the config and what /v1/placement said."""
    entry = launch.llamacpp_model_entry(
        MODEL, model_path, context=context, concurrency=slots, slots=slots, n_threads=n_threads
    )
    config = launch.gateway_config(free_port(), [entry])
    load = {"sequential": sequential, "concurrency": concurrency, "max_tokens": max_tokens}
    gateway = launch.start_gateway("live-speed-gateway", config, log_dir=log_dir)
    try:
        result = asyncio.run(_load(gateway.root_url, **load))
    finally:
        gateway.process.stop()
    settings = {"n_threads": n_threads, "context": context, "slots": slots, **load}
    return {"bench": "live_speed", "settings": settings, "config": config, **result}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.live_speed", description=__doc__.splitlines()[0])
    p.add_argument("--output", type=Path, required=True)
    p.add_argument("--model-path", type=Path, help="GGUF (default: the embedded SmolLM2-135M Q4_1)")
    p.add_argument("--n-threads", type=int, default=None, help="llama.cpp threads (default: the worker's)")
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--sequential", type=int, default=8, help="streams sent one at a time")
    p.add_argument("--concurrency", type=int, default=4, help="streams sent at once afterwards")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--log-dir", type=Path, default=Path("bench/out/live-speed-logs"))
    args = p.parse_args(argv)
    model_path = args.model_path or launch.default_model_path()
    meta = provenance.collect(model_shape=provenance.gguf_shape(model_path))
    result = run(
        model_path, args.log_dir, n_threads=args.n_threads, context=args.context, slots=args.slots,
        sequential=args.sequential, concurrency=args.concurrency, max_tokens=args.max_tokens,
    )  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({**meta, **result}, indent=2) + "\n")
    print(live_speed_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
