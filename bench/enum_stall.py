"""A large enum beside a running stream on the CPU (issue 35, item 1's measurement): our worker on the embedded
SmolLM2 (2 slots, ctx 4096), one greedy 48-token stream alone vs the same stream started ~1 s after a chat
request whose `response_format` is a JSON schema `{"type": "string", "enum": [N values]}` (N = 20,000 by
default), in one run, the two interleaved per repetition (the order alternating).

The issue's bar: beside the heavy request, no inter-chunk gap of the stream over 2x its normal p99, i.e.
`beside max / alone p99 < 2`. Gaps are between the stream's token chunks (those with text). The heavy request's
status, latency, tokens and whether its answer is one of the enum's values are kept; a grammar over the
worker's bound (1 MiB of GBNF) answers 400, so `--values` past ~40,000 measures nothing.

Writes `results.json` (provenance, every gap) and `README.md` (the table) into `--out DIR`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench import launch, provenance
from bench.loadgen import make_client, parse_sse_line
from bench.stats import percentile

MODEL = "m"
SLOTS = 2
CTX = 4096
STREAM_TOKENS = 48
HEAVY_MAX_TOKENS = 40
HEAVY_LEAD_S = 1.0  # the heavy request is admitted, prefilled and sampling its first token when the stream starts
BAR = 2.0


def enum_schema(n: int) -> dict[str, Any]:
    """The integration test's schema (`tests/integration/test_slow_lane_worker.py`): n distinct values."""
    rng = random.Random(n)
    return {"type": "string", "enum": [f"value-{i}-{rng.randrange(10**6)}" for i in range(n)]}


def heavy_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Pick one value."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "pick", "schema": schema}},
        "max_tokens": HEAVY_MAX_TOKENS,
        "temperature": 0,
    }


def gaps_of(times: Sequence[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def gap_stats(gaps_s: Sequence[float]) -> dict[str, Any]:
    """p50, p99 and max of inter-chunk gaps given in seconds, in milliseconds (None when there are none)."""
    p50, p99 = percentile(gaps_s, 50), percentile(gaps_s, 99)
    return {
        "gaps": len(gaps_s),
        "p50_ms": None if p50 is None else round(p50 * 1000, 1),
        "p99_ms": None if p99 is None else round(p99 * 1000, 1),
        "max_ms": round(max(gaps_s) * 1000, 1) if gaps_s else None,
    }


def ratio(alone_gaps_s: Sequence[float], beside_gaps_s: Sequence[float]) -> float | None:
    """The issue's measure: the largest gap beside the heavy request over the p99 gap of the stream alone."""
    p99 = percentile(alone_gaps_s, 99)
    if p99 is None or p99 <= 0 or not beside_gaps_s:
        return None
    return round(max(beside_gaps_s) / p99, 2)


def summarize(alone_gaps_s: Sequence[float], beside_gaps_s: Sequence[float]) -> dict[str, Any]:
    """One comparison (a repetition, or every repetition's gaps pooled): both distributions and the ratio."""
    r = ratio(alone_gaps_s, beside_gaps_s)
    return {
        "alone": gap_stats(alone_gaps_s),
        "beside": gap_stats(beside_gaps_s),
        "ratio": r,
        "under_bar": None if r is None else r < BAR,
    }


async def timed_stream(client: httpx.AsyncClient, url: str) -> tuple[list[float], float, int]:
    """A plain greedy stream of `STREAM_TOKENS` tokens: when its token chunks came, when it ended, its status."""
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": STREAM_TOKENS, "ignore_eos": True,
            "temperature": 0, "stream": True}  # fmt: skip
    times: list[float] = []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            event = parse_sse_line(line)
            if isinstance(event, dict) and any(c.get("text") for c in event.get("choices") or []):
                times.append(time.monotonic())
        status = response.status_code
    return times, time.monotonic(), status


async def alone(client: httpx.AsyncClient, url: str) -> dict[str, Any]:
    times, _, status = await timed_stream(client, url)
    return {"stream_status": status, "chunks": len(times), "gaps_s": gaps_of(times)}


def heavy_outcome(reply: httpx.Response, schema: dict[str, Any]) -> dict[str, Any]:
    """The heavy request's status, tokens and whether its answer is one of the enum's values."""
    out: dict[str, Any] = {"heavy_status": reply.status_code}
    try:
        body = reply.json()
    except ValueError:
        return out | {"heavy_error": reply.text[:300]}
    if reply.status_code != 200:
        return out | {"heavy_error": body.get("error", body)}
    content = body["choices"][0]["message"]["content"]
    try:
        valid = json.loads(content) in schema["enum"]
    except (ValueError, TypeError):
        valid = False
    tokens = (body.get("usage") or {}).get("completion_tokens")
    return out | {"heavy_content": content, "heavy_valid": valid, "heavy_tokens": tokens}


async def beside(client: httpx.AsyncClient, url: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The stream started `HEAVY_LEAD_S` after the heavy request; times are seconds from the heavy request's start."""
    t0 = time.monotonic()
    heavy = asyncio.create_task(client.post(f"{url}/v1/chat/completions", json=heavy_body(schema)))
    await asyncio.sleep(HEAVY_LEAD_S)
    stream_start = time.monotonic()
    times, stream_end, status = await timed_stream(client, url)
    reply = await heavy
    heavy_end = time.monotonic()  # at most this: the stream's reading may have delayed noticing it
    return {
        "stream_status": status,
        "chunks": len(times),
        "gaps_s": gaps_of(times),
        "stream_start_s": round(stream_start - t0, 3),
        "stream_end_s": round(stream_end - t0, 3),
        "heavy_s": round(heavy_end - t0, 3) if heavy.done() else None,
        "stream_ended_first": stream_end < heavy_end,
        **heavy_outcome(reply, schema),
    }


async def measure(url: str, schema: dict[str, Any], reps: int) -> list[dict[str, Any]]:
    """`reps` repetitions of alone and beside, the order alternating; each printed as it is measured."""
    rows: list[dict[str, Any]] = []
    async with make_client(4, 900) as client:
        await timed_stream(client, url)  # warm-up: pages, the connection
        for rep in range(reps):
            row: dict[str, Any] = {"rep": rep, "order": ["alone", "beside"] if rep % 2 == 0 else ["beside", "alone"]}
            for what in row["order"]:
                row[what] = await alone(client, url) if what == "alone" else await beside(client, url, schema)
            row["summary"] = summarize(row["alone"]["gaps_s"], row["beside"]["gaps_s"])
            brief = {k: v for k, v in row["beside"].items() if k not in ("gaps_s", "heavy_content")}
            print(json.dumps({"rep": rep, **row["summary"], "beside": brief}), flush=True)
            rows.append(row)
    return rows


def overall(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every repetition's gaps pooled, and the heavy requests' latencies and statuses."""
    alone_gaps = [g for r in rows for g in r["alone"]["gaps_s"]]
    beside_gaps = [g for r in rows for g in r["beside"]["gaps_s"]]
    heavy = [r["beside"] for r in rows]
    return summarize(alone_gaps, beside_gaps) | {
        "heavy_s": [h["heavy_s"] for h in heavy],
        "heavy_status": [h["heavy_status"] for h in heavy],
        "stream_ended_first": [h["stream_ended_first"] for h in heavy],
    }


def _fmt(value: Any) -> str:
    return "-" if value is None else str(value)


def table(rows: Sequence[dict[str, Any]], total: dict[str, Any]) -> str:
    lines = [
        "| rep | alone p50 ms | alone p99 ms | beside p50 ms | beside p99 ms | beside max ms "
        "| beside max / alone p99 | heavy s | heavy status | stream ended first |",
        "|---|--:|--:|--:|--:|--:|--:|--:|---|---|",
    ]
    for r in rows:
        s, b = r["summary"], r["beside"]
        status = f"{b['heavy_status']}" + (f", {b.get('heavy_tokens')} tokens" if b["heavy_status"] == 200 else "")
        if b["heavy_status"] == 200 and not b.get("heavy_valid"):
            status += ", not in the enum"
        lines.append(
            f"| {r['rep']} | {_fmt(s['alone']['p50_ms'])} | {_fmt(s['alone']['p99_ms'])} | "
            f"{_fmt(s['beside']['p50_ms'])} | {_fmt(s['beside']['p99_ms'])} | {_fmt(s['beside']['max_ms'])} | "
            f"{_fmt(s['ratio'])} | {_fmt(b['heavy_s'])} | {status} | {'yes' if b['stream_ended_first'] else 'no'} |"
        )
    t = total
    heavy = " / ".join(_fmt(h) for h in t["heavy_s"])
    statuses = " / ".join(str(s) for s in t["heavy_status"])
    ended = sum(bool(e) for e in t["stream_ended_first"])
    lines.append(
        f"| all (pooled) | {_fmt(t['alone']['p50_ms'])} | {_fmt(t['alone']['p99_ms'])} | "
        f"{_fmt(t['beside']['p50_ms'])} | {_fmt(t['beside']['p99_ms'])} | {_fmt(t['beside']['max_ms'])} | "
        f"**{_fmt(t['ratio'])}** | {heavy} | {statuses} | {ended} of {len(t['stream_ended_first'])} |"
    )
    return "\n".join(lines)


def lscpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return provenance.cpu_model()
    names = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")]
    return names[0] if names else provenance.cpu_model()


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return Path("/proc/loadavg").read_text().strip()


def readme(result: dict[str, Any]) -> str:
    meta, cfg, total = result["meta"], result["config"], result["overall"]
    env = "PYTHONPATH=$PWD " if cfg.get("pythonpath") == meta["cwd"] else ""
    verdict = "met" if total["under_bar"] else "missed" if total["under_bar"] is not None else "not measured"
    if any(status != 200 for status in total["heavy_status"]):  # a refused grammar leaves the stream alone
        verdict = f"not measured (the heavy request answered {total['heavy_status']})"
    return f"""# A {cfg["values"]:,}-value enum beside a running stream (CPU), {meta["started_utc"][:10]}

Issue 35, item 1's bar: beside the heavy request, no inter-chunk gap of the stream over 2x its normal p99
(`beside max / alone p99 < {BAR:g}`): **{verdict}** (pooled ratio {_fmt(total["ratio"])}).

Command (commit `{meta["git"]["commit"]}`{", dirty tree" if meta["git"]["dirty"] else ""}):

```
{env}{meta["command"]}
```

Our llama.cpp worker on the embedded SmolLM2-135M-Instruct Q4_1, started directly (no gateway): {cfg["slots"]}
slots, `--ctx {cfg["ctx"]}`, `--n-threads {cfg["n_threads"]}`. Per repetition, in alternating order: **alone**, a
greedy {STREAM_TOKENS}-token stream from `/v1/completions` (`ignore_eos`, temperature 0); **beside**, the same
stream started {HEAVY_LEAD_S:g} s after a chat request with `response_format` json_schema
`{{"type": "string", "enum": [{cfg["values"]:,} values]}}` (the integration test's `enum_schema`; its grammar
{cfg["grammar_bytes"]:,} bytes of GBNF), `max_tokens` {HEAVY_MAX_TOKENS}, temperature 0. Gaps are between the
stream's token chunks; "heavy s" is the heavy request's latency from its start.

Machine: `lscpu` model name "{result["lscpu_model"]}", {meta["hardware"]["cpu_count"]} CPUs. Load (`uptime`):

- before: `{result["uptime_before"]}`
- after: `{result["uptime_after"]}`

{result["table"]}

`results.json` holds every gap (seconds), the heavy requests' answers and the worker's `/health` after the run.
"""


def grammar_bytes(schema: dict[str, Any]) -> int:
    """The GBNF the worker builds for `schema` (imported here: it loads llama_cpp)."""
    from backends.llamacpp.worker.tools import schema_grammar

    return len(schema_grammar(schema))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=None, help="GGUF (default: the embedded SmolLM2)")
    p.add_argument("--values", type=int, default=20_000, help="the enum's values (default 20,000)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--n-threads", type=int, default=1, help="the worker's decode threads (default 1)")
    p.add_argument("--log-dir", type=Path, default=Path("/tmp/voltgate-bench/enum-stall"))
    p.add_argument(
        "--out", type=Path, default=Path(f"bench/results/{time.strftime('%Y-%m-%d', time.gmtime())}-enum-stall")
    )
    args = p.parse_args(argv)
    schema = enum_schema(args.values)
    config = {"values": args.values, "grammar_bytes": grammar_bytes(schema), "slots": SLOTS, "ctx": CTX,
              "n_threads": args.n_threads, "reps": args.reps, "pythonpath": os.environ.get("PYTHONPATH")}  # fmt: skip
    meta = provenance.collect()
    before = uptime()
    worker = launch.start_worker("enum_stall_worker", args.model or launch.default_model_path(), model_name=MODEL,
                                 slots=SLOTS, ctx=CTX, n_threads=args.n_threads, log_dir=args.log_dir)  # fmt: skip
    try:
        rows = asyncio.run(measure(worker.root_url, schema, args.reps))
        health = httpx.get(f"{worker.root_url}/health", timeout=10, trust_env=False).json()
    finally:
        worker.stop()
    total = overall(rows)
    result: dict[str, Any] = {"meta": meta, "config": config, "worker_argv": worker.info["argv"],
                              "lscpu_model": lscpu_model(), "uptime_before": before, "uptime_after": uptime(),
                              "rows": rows, "overall": total, "health": health}  # fmt: skip
    result["table"] = table(rows, total)
    print(result["table"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    (args.out / "README.md").write_text(readme(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
