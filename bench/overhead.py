"""The gateway's own cost, measured side by side in one run (issue 7, item 2).

Paths, each hit by the same load in rotating order, round after round:
  direct   the upstream itself
  floor    `bench.relay_floor` (Starlette + httpx passthrough) in front of it: the cheapest possible relay
  gateway  `voltgate serve` in front of it, with API-key auth and metrics on
Upstreams: (a) the real llama.cpp worker on SmolLM2 (the one the gateway started; we also call it on its own
port), (b) `bench.zero_upstream`, which streams chunks instantly (or 1 ms apart), so only relays cost time.

Pinning (Linux, ≥ 2 CPUs): upstream and load generator on CPU 0, the relay under test on CPU 1.
Reported: relay CPU seconds per 1,000 streamed chunks (psutil, before/after, relay PID only), added TTFT
with one request at a time (gateway minus direct, medians and paired), chunks/s, gateway/direct throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import launch, provenance
from bench.loadgen import LoadSpec, make_client, run_level, send_one
from bench.processes import ProcessFailedError, cpu_seconds, find_worker, pin_all_threads, pin_self
from bench.stats import RequestRecord, bootstrap_median_ci, median, percentile, ratio, summarize

GOALS = {"cpu_s_per_1k_chunks_max": 0.10, "added_ttft_ms_max": 2.0, "throughput_ratio_min": 0.98}


@dataclass(frozen=True)
class Target:
    """One path to the same upstream; `cpu_pid` is the relay whose CPU time is charged to it."""

    label: str
    base_url: str
    cpu_pid: int | None = None


def _rotated(targets: Sequence[Target], round_index: int) -> list[Target]:
    k = round_index % len(targets)
    return [*targets[k:], *targets[:k]]


async def interleaved_ttft(
    spec: LoadSpec, targets: Sequence[Target], *, rounds: int, gap_s: float = 0.0, lead: int = 0
) -> dict[str, Any]:
    """One request at a time, alternating paths every request so drift hits all paths alike.

    `lead` unrecorded requests to the same path go right before each recorded one, so that back to back a
    recorded request follows one of its own path, as a client's next request does. Without them the rotation
    fixes who comes before whom in most rounds: the floor follows `direct` (whose work ran on another CPU),
    the gateway follows the floor, and the tail of the floor's response (on the relays' CPU) is charged to
    the gateway's first token.
    Every request has its own prompt (a worker's prefix cache must not favour whichever path comes second).
    `added_ttft_ms_p50` is median(path) - median(direct); `added_ttft_ms_paired_p50` the median of the
    per-round differences, which cancels slow drift.
    """
    records: dict[str, list[RequestRecord]] = {t.label: [] for t in targets}
    index = 0
    async with make_client(4, spec.timeout_s) as client:
        for t in targets:  # warm each path's connection and the upstream
            await send_one(client, dataclasses.replace(spec, base_url=t.base_url), 10**9 + index, 0.0)
            index += 1
        for r in range(rounds):
            for t in _rotated(targets, r):
                path = dataclasses.replace(spec, base_url=t.base_url)
                for _ in range(lead):
                    await send_one(client, path, index, 0.0)
                    index += 1
                if gap_s:
                    await asyncio.sleep(gap_s)  # an idle client between requests (timers, caches, pools go cold)
                rec = await send_one(client, path, index, 0.0)
                index += 1
                records[t.label].append(rec)
    ms = {
        label: [r.ttft_s * 1000 if r.ok and r.ttft_s is not None else None for r in recs]
        for label, recs in records.items()
    }
    out: dict[str, Any] = {}
    for label, values in ms.items():
        ttfts = [v for v in values if v is not None]
        out[label] = {
            "requests": len(values),
            "errors": len(values) - len(ttfts),
            "ttft_ms_p50": median(ttfts),
            "ttft_ms_p90": percentile(ttfts, 90),
            "ttft_ms_mean": sum(ttfts) / len(ttfts) if ttfts else None,
        }
    base = targets[0].label
    for t in targets[1:]:
        p50, direct = out[t.label]["ttft_ms_p50"], out[base]["ttft_ms_p50"]
        out[t.label]["added_ttft_ms_p50"] = None if p50 is None or direct is None else p50 - direct
        pairs = [a - b for a, b in zip(ms[t.label], ms[base], strict=True) if a is not None and b is not None]
        out[t.label]["added_ttft_ms_paired_p50"] = median(pairs)
        out[t.label]["added_ttft_ms_paired_ci95"] = bootstrap_median_ci(pairs)
    return out


async def throughput_rounds(
    spec: LoadSpec, targets: Sequence[Target], *, concurrency: int, num_requests: int, rounds: int
) -> dict[str, Any]:
    """`rounds` x (each path in rotating order: `num_requests` at `concurrency`), with relay CPU time."""
    levels: dict[str, list[Any]] = {t.label: [] for t in targets}
    cpu: dict[str, float] = {t.label: 0.0 for t in targets}
    index = 0
    async with make_client(max(concurrency, 8), spec.timeout_s) as client:
        for t in targets:  # warm-up, unrecorded: opens `concurrency` connections per path
            await run_level(
                client,
                dataclasses.replace(spec, base_url=t.base_url, output_tokens=2),
                num_requests=concurrency,
                concurrency=concurrency,
                first_index=10**9,
            )
        for r in range(rounds):
            for t in _rotated(targets, r):
                before = cpu_seconds(t.cpu_pid) if t.cpu_pid else 0.0
                level = await run_level(
                    client,
                    dataclasses.replace(spec, base_url=t.base_url),
                    num_requests=num_requests,
                    concurrency=concurrency,
                    first_index=index,
                )
                if t.cpu_pid:
                    cpu[t.label] += cpu_seconds(t.cpu_pid) - before
                index += num_requests
                levels[t.label].append(level)
    out: dict[str, Any] = {}
    for t in targets:
        records = [rec for lv in levels[t.label] for rec in lv.records]
        summary = summarize(records, sum(lv.duration_s for lv in levels[t.label]))
        chunks = summary["chunks"]
        out[t.label] = {
            "summary": summary,
            "round_output_throughput": [lv.summary["output_throughput"] for lv in levels[t.label]],
            "relay_cpu_s": cpu[t.label] if t.cpu_pid else None,
            "relay_cpu_s_per_1k_chunks": cpu[t.label] / chunks * 1000 if t.cpu_pid and chunks else None,
        }
    direct = out[targets[0].label]["summary"]
    for t in targets[1:]:
        s = out[t.label]["summary"]
        out[t.label]["output_throughput_ratio_to_direct"] = ratio(s["output_throughput"], direct["output_throughput"])
        out[t.label]["chunk_throughput_ratio_to_direct"] = ratio(s["chunk_throughput"], direct["chunk_throughput"])
    return out


def _metrics_excerpt(root_url: str) -> list[str]:
    """The gateway's request counters after the run: evidence that metrics were on and counted the load."""
    try:
        text = httpx.get(f"{root_url}/metrics", timeout=5, trust_env=False).text
    except httpx.HTTPError as exc:
        return [f"unavailable: {type(exc).__name__}"]
    return [ln for ln in text.splitlines() if "requests_total{" in ln or "requests_total " in ln][:12]


@dataclass(frozen=True)
class Pinning:
    """Which CPU each role runs on; all None when pinning is impossible here."""

    upstream: str | None
    relay: str | None
    loadgen: set[int] | None

    @classmethod
    def detect(cls) -> Pinning:
        """The first two CPUs this process may use, when there are two and taskset exists."""
        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if len(allowed) >= 2 and shutil.which("taskset"):
            return cls(str(allowed[0]), str(allowed[1]), {allowed[0]})
        return cls(None, None, None)

    def describe(self) -> str:
        if self.relay is None:
            return "not pinned (fewer than 2 CPUs or no taskset)"
        return (
            f"taskset: upstream + load generator on CPU {self.upstream}, relay under test "
            f"(gateway or floor) on CPU {self.relay}"
        )


def bench_real_worker(model_path: Path, log_dir: Path, pin: Pinning, *, quick: bool) -> dict[str, Any]:
    """(a) The real llama.cpp worker: direct vs floor vs gateway, c=1 TTFT and c=1/c=8 throughput."""
    slots = 8
    model = "smollm2-135m"
    gw_port = launch.free_port()
    entry = launch.llamacpp_model_entry(model, model_path, context=512, concurrency=slots, slots=slots, n_threads=1)
    gateway = launch.start_gateway(
        "gateway-real", launch.gateway_config(gw_port, [entry]), log_dir=log_dir, cpus=pin.relay
    )
    try:
        worker_pid, worker_port = find_worker(gateway.pid)
        if pin.upstream is not None:
            pin_all_threads(worker_pid, pin.upstream)
        worker_root = f"http://127.0.0.1:{worker_port}"
        floor = launch.start_floor("floor-real", worker_root, log_dir=log_dir, cpus=pin.relay)
        try:
            targets = [
                Target("direct", f"{worker_root}/v1"),
                Target("floor", floor.base_url, floor.pid),
                Target("gateway", gateway.base_url, gateway.pid),
            ]
            spec = LoadSpec(base_url="", model=model, prompt_tokens=64, output_tokens=4, api_key=launch.BENCH_API_KEY)
            ttft = asyncio.run(interleaved_ttft(spec, targets, rounds=8 if quick else 20))
            spec = dataclasses.replace(spec, output_tokens=16 if quick else 32)
            tput = {}
            for c in (1, 8):
                tput[f"c{c}"] = asyncio.run(
                    throughput_rounds(
                        spec,
                        targets,
                        concurrency=c,
                        num_requests=(3 if c == 1 else 8) if quick else (4 if c == 1 else 8),
                        rounds=2 if quick else 4,
                    )
                )
            worker_health = httpx.get(f"{worker_root}/health", timeout=5, trust_env=False).json()
            metrics = _metrics_excerpt(gateway.root_url)
        finally:
            floor.stop()
    finally:
        gateway.stop()
    return {
        "upstream": "llama.cpp worker started by the gateway (SmolLM2-135M Q4_1), called directly on its port too",
        "worker": {"slots": slots, "n_threads": 1, "cpus": pin.upstream, "health": worker_health},
        "load": {"prompt_words": 64, "ttft_output_tokens": 4, "output_tokens": spec.output_tokens},
        "ttft_c1": ttft,
        "throughput": tput,
        "gateway_metrics": metrics,
    }


def bench_zero_upstream(
    log_dir: Path, pin: Pinning, *, quick: bool, chunk_interval_ms: float = 0.0, concurrency: int = 8
) -> dict[str, Any]:
    """(b) The zero-latency upstream: direct vs floor vs gateway (the gateway needs a `remote` source).

    Instant chunks measure the most a relay can carry; paced ones (`chunk_interval_ms`) reach the relay one
    read at a time, as a real engine's tokens do, so its per-chunk cost is not amortised over a batch.
    """
    model = "zero"
    tag = "zero" if not chunk_interval_ms else "zero-paced"
    zero = launch.start_zero_upstream(
        f"{tag}-upstream", model_name=model, log_dir=log_dir, cpus=pin.upstream, chunk_interval_ms=chunk_interval_ms
    )
    started: list[launch.Served] = [zero]
    gateway_skipped = None
    try:
        floor = launch.start_floor(f"floor-{tag}", zero.root_url, log_dir=log_dir, cpus=pin.relay)
        started.append(floor)
        targets = [Target("direct", zero.base_url), Target("floor", floor.base_url, floor.pid)]
        try:
            entry = launch.remote_model_entry(model, zero.base_url, concurrency=64)
            gateway = launch.start_gateway(
                f"gateway-{tag}",
                launch.gateway_config(launch.free_port(), [entry]),
                log_dir=log_dir,
                cpus=pin.relay,
                timeout_s=60,
            )
            started.append(gateway)
            targets.append(Target("gateway", gateway.base_url, gateway.pid))
        except ProcessFailedError as exc:
            reason = " / ".join(ln.strip() for ln in str(exc).splitlines()[-3:])
            gateway_skipped = f"gateway did not start with a `remote` source: {reason[:300]}"
            print(f"{tag}: {gateway_skipped}", file=sys.stderr)
        spec = LoadSpec(base_url="", model=model, prompt_tokens=64, output_tokens=16, api_key=launch.BENCH_API_KEY)
        ttft = None
        if not chunk_interval_ms:
            ttft = asyncio.run(interleaved_ttft(spec, targets, rounds=50 if quick else 200))
        chunks = 256
        spec = dataclasses.replace(spec, output_tokens=chunks)
        requests = (3 if quick else 8) * concurrency if chunk_interval_ms else (48 if quick else 128)
        tput = asyncio.run(throughput_rounds(spec, targets, concurrency=concurrency, num_requests=requests, rounds=3))
        health = httpx.get(f"{zero.root_url}/health", timeout=5, trust_env=False).json()
    finally:
        for served in reversed(started):
            served.stop()
    how = f"paced, {chunk_interval_ms:g} ms between chunks" if chunk_interval_ms else "every chunk at once"
    return {
        "upstream": f"bench.zero_upstream ({how}), no model",
        "load": {
            "ttft_output_tokens": 16,
            "chunks_per_request": chunks,
            "concurrency": concurrency,
            "requests_per_round": requests,
            "chunk_interval_ms": chunk_interval_ms,
        },
        "gateway_skipped": gateway_skipped,
        "upstream_health_after": health,
        "ttft_c1": ttft,
        "throughput": {f"c{concurrency}": tput},
    }


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


_SOURCES = {
    "zero_paced": "zero upstream, paced 1 ms, c=16",
    "real_c8": "real worker, c=8",
    "zero_instant_c8": "zero upstream, instant, c=8",
    "zero_paired": "zero upstream, median of paired diffs",
    "real_paired": "real worker, median of paired diffs",
}


def _first_key(values: dict[str, Any], keys: Sequence[str]) -> str | None:
    """The first of `keys` with a measured value: the preferred figure, else the next best."""
    return next((k for k in keys if values.get(k) is not None), None)


def headline(result: dict[str, Any]) -> dict[str, Any]:
    """The numbers issue 7 asks for, per relay, with pass/fail against its goals (None where not measured).

    The CPU goal is judged on paced chunks (each reaches the relay on its own, as real tokens do), else on
    the real worker; the TTFT goal on the zero upstream (no model noise), else on the real worker.
    """
    real = result.get("real_worker") or {}
    zero = result.get("zero_upstream") or {}
    paced = result.get("zero_paced") or {}
    zero_c8 = _get(zero, "throughput", "c8") or {}
    paced_tput = next(iter((paced.get("throughput") or {}).values()), {})
    h: dict[str, Any] = {"cpu_s_per_1k_chunks": {}, "added_ttft_ms": {}, "throughput_ratio_real": {}}
    for relay in ("gateway", "floor"):
        h["cpu_s_per_1k_chunks"][relay] = {
            "zero_paced": _get(paced_tput, relay, "relay_cpu_s_per_1k_chunks"),
            "zero_instant_c8": _get(zero_c8, relay, "relay_cpu_s_per_1k_chunks"),
            "real_c8": _get(real, "throughput", "c8", relay, "relay_cpu_s_per_1k_chunks"),
        }
        h["added_ttft_ms"][relay] = {
            "zero": _get(zero, "ttft_c1", relay, "added_ttft_ms_p50"),
            "zero_paired": _get(zero, "ttft_c1", relay, "added_ttft_ms_paired_p50"),
            "real": _get(real, "ttft_c1", relay, "added_ttft_ms_p50"),
            "real_paired": _get(real, "ttft_c1", relay, "added_ttft_ms_paired_p50"),
            "zero_paired_ci95": _get(zero, "ttft_c1", relay, "added_ttft_ms_paired_ci95"),
            "real_paired_ci95": _get(real, "ttft_c1", relay, "added_ttft_ms_paired_ci95"),
        }
        h["throughput_ratio_real"][relay] = {
            f"c{c}": _get(real, "throughput", f"c{c}", relay, "output_throughput_ratio_to_direct") for c in (1, 8)
        }
    h["chunks_per_s_zero_c8"] = {k: _get(v, "summary", "chunk_throughput") for k, v in zero_c8.items()}
    h["gateway_to_floor_chunks_ratio_zero"] = ratio(
        h["chunks_per_s_zero_c8"].get("gateway"), h["chunks_per_s_zero_c8"].get("floor")
    )
    cpu = h["cpu_s_per_1k_chunks"]["gateway"]
    added = h["added_ttft_ms"]["gateway"]
    ratios = list(h["throughput_ratio_real"]["gateway"].values())
    cpu_src = _first_key(cpu, ("zero_paced", "real_c8", "zero_instant_c8"))
    added_src = _first_key(added, ("zero_paired", "real_paired"))
    cpu_v = cpu[cpu_src] if cpu_src else None
    added_v = added[added_src] if added_src else None
    h["goals"] = {
        **GOALS,
        "cpu_judged_on": cpu_v,
        "cpu_source": _SOURCES.get(cpu_src or ""),
        "added_ttft_judged_on": added_v,
        "added_ttft_source": _SOURCES.get(added_src or ""),
        "added_ttft_ci95": added.get(f"{added_src}_ci95") if added_src else None,
        "cpu_met": None if cpu_v is None else cpu_v <= GOALS["cpu_s_per_1k_chunks_max"],
        "added_ttft_met": None if added_v is None else added_v <= GOALS["added_ttft_ms_max"],
        "throughput_ratio_met": None if None in ratios else min(ratios) >= GOALS["throughput_ratio_min"],
    }
    return h


def run(
    model_path: Path, log_dir: Path, *, quick: bool = False, parts: Sequence[str] = ("real", "zero", "paced")
) -> dict[str, Any]:
    """Both overhead benches in one run, pinned; returns the result document."""
    pin = Pinning.detect()
    saved = os.sched_getaffinity(0)
    if pin.loadgen is not None:
        pin_self(pin.loadgen)
    try:
        result: dict[str, Any] = {"kind": "overhead", "pinning": pin.describe()}
        if "real" in parts:
            result["real_worker"] = bench_real_worker(model_path, log_dir, pin, quick=quick)
        if "zero" in parts:
            result["zero_upstream"] = bench_zero_upstream(log_dir, pin, quick=quick)
        if "paced" in parts:
            result["zero_paced"] = bench_zero_upstream(log_dir, pin, quick=quick, chunk_interval_ms=1.0, concurrency=16)
    finally:
        os.sched_setaffinity(0, saved)
    result["headline"] = headline(result)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__.splitlines()[0])
    p.add_argument("--model-path", type=Path, default=None, help="GGUF (default: the embedded SmolLM2)")
    p.add_argument("--parts", nargs="+", choices=("real", "zero", "paced"), default=("real", "zero", "paced"))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--log-dir", type=Path, default=Path("bench/out/logs"))
    p.add_argument("--output", type=Path, required=True)
    args = p.parse_args(argv)
    model_path = args.model_path or launch.default_model_path()
    meta = provenance.collect(model_shape=provenance.gguf_shape(model_path))
    result = {"meta": meta, **run(model_path, args.log_dir, quick=args.quick, parts=args.parts)}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["headline"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
