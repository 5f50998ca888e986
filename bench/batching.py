"""Continuous batching on CPU (issue 6): aggregate and per-stream output tok/s, one slot vs many, one run.

The same worker program on the same GGUF is started twice, `--slots 1` and `--slots N`; optionally a gateway
in front of a third, N-slot worker it manages. Concurrency levels are run in turn, and at each level every
series is hit in rotating order, so drift on a shared machine hits all series alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench import launch, provenance
from bench.loadgen import LevelResult, LoadSpec, format_row, make_client, run_level
from bench.stats import ratio


@dataclass(frozen=True)
class SeriesSpec:
    label: str
    slots: int
    path: str  # "direct" or "gateway"
    base_url: str


async def _sweep(
    spec: LoadSpec, series: Sequence[SeriesSpec], concurrencies: Sequence[int], requests_per_level: dict[int, int]
) -> dict[str, list[LevelResult]]:
    results: dict[str, list[LevelResult]] = {s.label: [] for s in series}
    index = 0
    async with make_client(max(concurrencies) + 4, spec.timeout_s) as client:
        for s in series:  # warm-up, unrecorded: model pages, connections
            await run_level(
                client, replace(spec, base_url=s.base_url), num_requests=2, concurrency=2, first_index=10**9
            )
        for i, c in enumerate(concurrencies):
            k = i % len(series)
            for s in [*series[k:], *series[:k]]:
                level = await run_level(
                    client,
                    replace(spec, base_url=s.base_url),
                    concurrency=c,
                    num_requests=requests_per_level[c],
                    first_index=index,
                    label=s.label,
                )
                index += requests_per_level[c]
                results[s.label].append(level)
                print(format_row(level), flush=True)
    return results


def quant_label(model_path: Path) -> str:
    """The quantisation named in a GGUF file name (`...Q4_K_M.gguf` → Q4_K_M), else 'GGUF'."""
    match = re.search(r"(?<![A-Za-z0-9])(IQ\d\w*|Q\d(?:_[0-9A-Z]+)*|BF16|F16|F32)(?=[.-]|$)", model_path.stem, re.I)
    return match.group(1).upper() if match else "GGUF"


def compare(series: list[dict[str, Any]], many_label: str, one_label: str) -> list[dict[str, Any]]:
    """Per level: aggregate tok/s of both, their ratio, and per-stream decode speed vs the c=1 speed."""

    def by_c(label: str) -> dict[int, dict[str, Any]]:
        s = next(x for x in series if x["label"] == label)
        return {lv["concurrency"]: lv["summary"] for lv in s["levels"]}

    many, one = by_c(many_label), by_c(one_label)
    single_stream = (many.get(min(many)) or {}).get("decode_tok_s_per_stream", {}).get("p50") if many else None
    rows = []
    for c in sorted(many):
        m, o = many[c], one.get(c, {})
        per_stream = m["decode_tok_s_per_stream"]["p50"]
        rows.append(
            {
                "concurrency": c,
                "slots_many_tok_s": m["output_throughput"],
                "slots_one_tok_s": o.get("output_throughput"),
                "speedup": ratio(m["output_throughput"], o.get("output_throughput")),
                "per_stream_decode_tok_s": per_stream,
                "per_stream_vs_single_stream": ratio(per_stream, single_stream),
                "ttft_ms_p50_many": m["ttft_ms"]["p50"],
                "ttft_ms_p50_one": (o.get("ttft_ms") or {}).get("p50"),
                "errors": {**m["errors"], **{f"one:{k}": v for k, v in (o.get("errors") or {}).items()}},
            }
        )
    return rows


def run(
    model_path: Path,
    log_dir: Path,
    *,
    concurrencies: Sequence[int] = (1, 4, 8, 16),
    many_slots: int = 16,
    n_threads: int | None = None,
    prompt_tokens: int = 64,
    output_tokens: int = 64,
    requests_per_level: int | None = None,
    requests_per_stream: int = 2,
    n_gpu_layers: int = 0,
    with_gateway: bool = True,
) -> dict[str, Any]:
    """Start the workers (and gateway), sweep, stop them; returns the result document.

    Each level sends `requests_per_level` requests, or max(8, `requests_per_stream` x concurrency).
    """
    model = "smollm2-135m"
    engine = f"llama.cpp {quant_label(model_path)}"
    ctx = prompt_tokens + output_tokens + 64
    per_level = {c: requests_per_level or max(8, requests_per_stream * c) for c in concurrencies}
    started: list[launch.Served] = []
    try:
        one = launch.start_worker(
            "worker-slots1",
            model_path,
            model_name=model,
            slots=1,
            ctx=ctx,
            n_threads=n_threads,
            log_dir=log_dir,
            n_gpu_layers=n_gpu_layers,
        )
        started.append(one)
        many = launch.start_worker(
            f"worker-slots{many_slots}",
            model_path,
            model_name=model,
            slots=many_slots,
            ctx=ctx,
            n_threads=n_threads,
            log_dir=log_dir,
            n_gpu_layers=n_gpu_layers,
        )
        started.append(many)
        series = [
            SeriesSpec(f"{engine}, {many_slots} slots, direct", many_slots, "direct", many.base_url),
            SeriesSpec(f"{engine}, 1 slot, direct", 1, "direct", one.base_url),
        ]
        if with_gateway:
            entry = launch.llamacpp_model_entry(
                model, model_path, context=ctx, concurrency=many_slots, slots=many_slots, n_threads=n_threads
            )
            gw = launch.start_gateway(
                "gateway-batching", launch.gateway_config(launch.free_port(), [entry]), log_dir=log_dir
            )
            started.append(gw)
            series.append(SeriesSpec(f"{engine}, {many_slots} slots, via gateway", many_slots, "gateway", gw.base_url))
        spec = LoadSpec(
            base_url="",
            model=model,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            api_key=launch.BENCH_API_KEY,
        )
        levels = asyncio.run(_sweep(spec, series, concurrencies, per_level))
        servers = dict(
            zip((s.label for s in series), (many.info, one.info, *(x.info for x in started[2:])), strict=True)
        )
    finally:
        for served in reversed(started):
            served.stop()
    out_series = [
        {
            "label": s.label,
            "slots": s.slots,
            "path": s.path,
            "server": servers[s.label],
            "levels": [lv.to_json() for lv in levels[s.label]],
        }
        for s in series
    ]
    return {
        "kind": "batching",
        "load": {
            "prompt_words": prompt_tokens,
            "output_tokens": output_tokens,
            "ignore_eos": True,
            "requests_per_level": per_level,
            "n_threads": n_threads or "worker default (all cores)",
            "ctx_per_slot": ctx,
        },
        "series": out_series,
        "comparison": compare(out_series, series[0].label, series[1].label),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.batching", description=__doc__.splitlines()[0])
    p.add_argument("--model-path", type=Path, default=None, help="GGUF (default: the embedded SmolLM2)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    p.add_argument("--slots", type=int, default=16, help="slots of the batching worker (vs 1)")
    p.add_argument("--n-threads", type=int, default=None)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--num-requests", type=int, default=None, help="per level (default max(8, R x c))")
    p.add_argument("--requests-per-stream", type=int, default=2, help="R above")
    p.add_argument("--n-gpu-layers", type=int, default=0, help="worker layers on the GPU (-1 = all); 0 = CPU")
    p.add_argument("--no-gateway", action="store_true", help="only the two direct series")
    p.add_argument("--log-dir", type=Path, default=Path("bench/out/logs"))
    p.add_argument("--output", type=Path, required=True)
    args = p.parse_args(argv)
    model_path = args.model_path or launch.default_model_path()
    meta = provenance.collect(model_shape=provenance.gguf_shape(model_path))
    result = run(
        model_path,
        args.log_dir,
        concurrencies=args.concurrency,
        many_slots=args.slots,
        n_threads=args.n_threads,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        requests_per_level=args.num_requests,
        requests_per_stream=args.requests_per_stream,
        n_gpu_layers=args.n_gpu_layers,
        with_gateway=not args.no_gateway,
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"meta": meta, **result}, indent=2) + "\n")
    print(json.dumps(result["comparison"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
