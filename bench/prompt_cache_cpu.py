"""The host prompt cache's cost and gain on the CPU (issue 34, item 4): our worker on the embedded SmolLM2,
cache on vs off (and, with `--before DIR`, another checkout's worker with its cache on), in one run.

Two workloads, each at 1 and 4 streams on a 4-slot worker:
  unique    every prompt unique (~300 words, 32 tokens out): what a cache must not slow down; every admission
            past the fourth overwrites a slot that held a finished request.
  sessions  6 sessions of a ~900-word prefix each, 4 turns, the sessions' turns sent in rounds (at most
            `streams` at once): 6 sessions on 4 slots, so a session's KV is overwritten between its turns
            and comes back from host memory or is prefilled again.
Series are interleaved per level (rotating order) so the machine's drift hits them alike. Each request
streams from `/v1/completions` with usage; TTFT, output tok/s and cached prompt tokens come from it, and the
worker's `/health` gives the prompt cache's save counters and the engine time its copies took.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import launch, provenance
from bench.loadgen import make_client, make_prompt, parse_sse_line
from bench.processes import ManagedProcess, free_port

SLOTS = 4
SESSIONS = 6
TURNS = 4


@dataclass
class Turn:
    ttft_s: float
    e2e_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int


@dataclass
class Series:
    label: str
    root_url: str
    process: ManagedProcess
    results: dict[str, list[Turn]] = field(default_factory=dict)


async def one(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> tuple[Turn, str]:
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    start = time.perf_counter()
    ttft: float | None = None
    text: list[str] = []
    usage: dict[str, Any] = {}
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            event = parse_sse_line(line)
            if not isinstance(event, dict):
                continue
            for choice in event.get("choices") or []:
                if choice.get("text"):
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    text.append(choice["text"])
            usage = event.get("usage") or usage
    e2e = time.perf_counter() - start
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    turn = Turn(ttft or e2e, e2e, usage.get("prompt_tokens", 0), cached, usage.get("completion_tokens", 0))
    return turn, "".join(text)


async def unique_level(client: httpx.AsyncClient, url: str, streams: int, n: int, seed: int) -> list[Turn]:
    gate = asyncio.Semaphore(streams)

    async def run(i: int) -> Turn:
        async with gate:
            return (await one(client, url, make_prompt(300, seed + i), 32))[0]

    return list(await asyncio.gather(*(run(i) for i in range(n))))


async def sessions_level(client: httpx.AsyncClient, url: str, streams: int, seed: int) -> list[Turn]:
    """Every session's turns, in rounds; turn 1 of each session is marked by cached == -1 afterwards."""
    gate = asyncio.Semaphore(streams)
    history = [make_prompt(900, seed + s) for s in range(SESSIONS)]
    turns: list[Turn] = []
    for t in range(TURNS):

        async def run(s: int, t: int = t) -> tuple[int, Turn, str]:
            async with gate:
                prompt = f"{history[s]}\nUser: {make_prompt(25, seed * 7 + s * 100 + t)}\nAssistant:"
                turn, answer = await one(client, url, prompt, 24)
                return s, turn, prompt + answer

        for s, turn, grown in await asyncio.gather(*(run(s) for s in range(SESSIONS))):
            history[s] = grown
            turns.append(turn if t else Turn(turn.ttft_s, turn.e2e_s, turn.prompt_tokens, -1, turn.output_tokens))
    return turns


def start(label: str, model: Path, log_dir: Path, extra: Sequence[str], source: Path | None) -> Series:
    port = free_port()
    args = ["--model", str(model), "--model-name", "m", "--host", "127.0.0.1", "--port", str(port),
            "--ctx", str(4096 * SLOTS), "--slots", str(SLOTS), "--n-threads", "2", *extra]  # fmt: skip
    if source is None:
        argv = [sys.executable, "-m", "backends.llamacpp.worker", *args]
    else:
        code = f"import runpy, sys; sys.path.insert(0, {str(source.resolve())!r}); "
        code += "runpy.run_module('backends.llamacpp.worker', run_name='__main__')"
        argv = [sys.executable, "-c", code, *args]
    proc = ManagedProcess(label.replace(" ", "_"), argv, log_dir=log_dir, env={"CUDA_VISIBLE_DEVICES": ""}).start()
    root = f"http://127.0.0.1:{port}"
    proc.wait_http(f"{root}/health", 180)
    return Series(label, root, proc)


def summary(turns: Sequence[Turn], duration_s: float | None = None) -> dict[str, Any]:
    warm = [t for t in turns if t.cached_tokens >= 0]
    out: dict[str, Any] = {
        "requests": len(turns),
        "ttft_p50_ms": round(statistics.median(t.ttft_s for t in warm) * 1000, 1) if warm else None,
        "prompt_tokens": sum(t.prompt_tokens for t in warm),
        "cached_tokens": sum(t.cached_tokens for t in warm),
    }
    out["cached_share"] = round(out["cached_tokens"] / out["prompt_tokens"], 3) if out["prompt_tokens"] else None
    if duration_s:
        out["output_tok_s"] = round(sum(t.output_tokens for t in turns) / duration_s, 1)
    return out


async def measure(series: list[Series], reps: int, out: Path | None) -> list[dict[str, Any]]:
    """Every level of every series, interleaved; each row is printed, and appended to `out` (JSON lines) as
    it comes, so a run stopped early keeps what it measured."""
    rows: list[dict[str, Any]] = []
    async with make_client(16, 600) as client:
        for s in series:  # warm-up: pages, connections
            await unique_level(client, s.root_url, 1, 2, 10**6)
        k = 0
        for rep in range(reps):
            for workload in ("unique", "sessions"):
                for streams in (1, 4):
                    for s in [*series[k % len(series) :], *series[: k % len(series)]]:
                        seed = 1000 * (rep + 1) + 100 * streams + (0 if workload == "unique" else 50_000)
                        t0 = time.perf_counter()
                        if workload == "unique":
                            turns = await unique_level(client, s.root_url, streams, 4 * max(streams, 2), seed)
                        else:
                            turns = await sessions_level(client, s.root_url, streams, seed)
                        row = {"series": s.label, "workload": workload, "streams": streams, "rep": rep,
                               **summary(turns, time.perf_counter() - t0)}  # fmt: skip
                        print(json.dumps(row), flush=True)
                        rows.append(row)
                        if out is not None:
                            with out.open("a") as f:
                                f.write(json.dumps(row) + "\n")
                    k += 1
    return rows


def table(rows: list[dict[str, Any]], health: dict[str, Any]) -> str:
    lines = ["| workload | streams | series | output tok/s (reps) | TTFT p50 ms (warm turns) | cached share |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    keys = sorted({(r["workload"], r["streams"], r["series"]) for r in rows}, key=lambda k: (k[0] != "unique", k))
    for workload, streams, label in keys:
        mine = [r for r in rows if (r["workload"], r["streams"], r["series"]) == (workload, streams, label)]
        tok = " / ".join(str(r["output_tok_s"]) for r in mine)
        ttft = " / ".join(str(r["ttft_p50_ms"]) for r in mine)
        share = " / ".join(str(r["cached_share"]) for r in mine)
        lines.append(f"| {workload} | {streams} | {label} | {tok} | {ttft} | {share} |")
    lines.append("")
    lines.append("| series | states saved | of which while idle | copy time on requests' path (s) | restored |")
    lines.append("|---|---|---|---|---|")
    for label, h in health.items():
        pc = h.get("prompt_cache") or {}
        old = "prompt_cache" not in h  # an older worker: only its entry count is known
        lines.append(
            f"| {label} | {pc.get('saved_total', '?')} | {pc.get('saved_idle_total', '?')} | "
            f"{pc.get('save_seconds_in_path', '?')} | {pc.get('restored_total', '?') if not old else '?'} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="GGUF (default: the embedded SmolLM2)")
    p.add_argument("--before", type=Path, default=None, help="another checkout's root: its worker, cache on")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--log-dir", type=Path, default=Path("/tmp/voltgate-bench/prompt-cache-cpu"))
    p.add_argument("--out", type=Path, default=None, help="write the JSON (rows, health, table) here")
    p.add_argument("--rows", type=Path, default=None, help="append each row here as it is measured (JSON lines)")
    args = p.parse_args(argv)
    model = args.model or launch.default_model_path()
    series = [start("cache on", model, args.log_dir, [], None),
              start("cache off", model, args.log_dir, ["--prompt-cache-mib", "0"], None)]  # fmt: skip
    try:
        if args.before is not None:
            series.append(start("before, cache on", model, args.log_dir, [], args.before))
        rows = asyncio.run(measure(series, args.reps, args.rows))
        health = {s.label: httpx.get(f"{s.root_url}/health", timeout=10).json() for s in series}
    finally:
        for s in series:
            s.process.stop()
    text = table(rows, health)
    print(text)
    if args.out is not None:
        result = {"meta": provenance.collect(), "argv": sys.argv, "rows": rows, "health": health, "table": text}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
