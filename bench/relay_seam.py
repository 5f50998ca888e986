"""The relay's cost beside the floor, in one pinned run (issue 27, item 9).

Paths to one `bench.zero_upstream` (instant chunks), hit by the same load in rotating order:
  direct   the upstream itself
  floor    `bench.relay_floor`: Starlette + httpx, bytes passed through as read (no parsing, no re-framing)
  gateway  `voltgate serve` (this checkout), API-key auth and metrics on
  before   optional (`--before DIR`): the gateway of another checkout (e.g. `git archive` of an older commit)
Reported: relay CPU seconds per 1,000 chunks at 1 / 16 / 64 streams (and requests/s), each relay's ratio to
the floor's; added time to first token at one stream back to back (each recorded request right after one to
the same path; `back_to_back_after_others`: right after another path's, the definition before session 10)
and with 200 ms between requests (paired medians vs direct, and the difference to the floor's). Pinning:
upstream, load generator and the relays under test each on their own CPU with 4 or more (with 2, as
`bench.overhead`: upstream and load generator on the first, the relays on the second); the relays take turns
on their CPU, they never run at once.
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
from pathlib import Path
from typing import Any

import yaml

from bench import launch, provenance
from bench.loadgen import LoadSpec
from bench.overhead import Target, interleaved_ttft, throughput_rounds
from bench.processes import ManagedProcess, pin_self

CONCURRENCY = (1, 16, 64)
CHUNKS = 256


def _cpus() -> tuple[str | None, str | None, set[int] | None]:
    allowed = sorted(os.sched_getaffinity(0))
    if not shutil.which("taskset"):
        return None, None, None
    if len(allowed) >= 4:  # skip CPU 0 (interrupts), one CPU per role
        return str(allowed[1]), str(allowed[2]), {allowed[3]}
    if len(allowed) >= 2:  # as bench.overhead pins: upstream and load generator share one, the relay the other
        return str(allowed[0]), str(allowed[1]), {allowed[0]}
    return None, None, None


def _gateway(
    name: str, config: dict[str, Any], log_dir: Path, cpus: str | None, source: Path | None = None
) -> launch.Served:
    if source is None:
        return launch.start_gateway(name, config, log_dir=log_dir, cpus=cpus, timeout_s=60)
    path = log_dir / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    root_dir = str(source.resolve())
    code = f"import runpy, sys; sys.path.insert(0, {root_dir!r}); runpy.run_module('gateway', run_name='__main__')"
    argv = [sys.executable, "-c", code, "serve", "--config", str(path)]
    env = {"VOLTGATE_API_KEYS": launch.BENCH_API_KEY, "CUDA_VISIBLE_DEVICES": ""}
    proc = ManagedProcess(name, argv, log_dir=log_dir, cpus=cpus, env=env).start()
    root = f"http://127.0.0.1:{config['server']['port']}"
    try:
        proc.wait_http(f"{root}/ready", 60)
    except BaseException:
        proc.stop()
        raise
    return launch.Served(proc, root, "zero", {"argv": argv, "cpus": cpus})


def run(
    log_dir: Path, *, before: Path | None, rounds: int, quick: bool, levels: Sequence[int] = CONCURRENCY
) -> dict[str, Any]:
    upstream_cpu, relay_cpu, loadgen = _cpus()
    if loadgen is not None:
        pin_self(loadgen)
    zero = launch.start_zero_upstream("zero-upstream", model_name="zero", log_dir=log_dir, cpus=upstream_cpu)
    started = [zero]
    try:
        floor = launch.start_floor("floor", zero.root_url, log_dir=log_dir, cpus=relay_cpu)
        started.append(floor)
        entry = launch.remote_model_entry("zero", zero.base_url, concurrency=64)
        gateway = _gateway("gateway", launch.gateway_config(launch.free_port(), [entry]), log_dir, relay_cpu)
        started.append(gateway)
        targets = [Target("direct", zero.base_url), Target("floor", floor.base_url, floor.pid),
                   Target("gateway", gateway.base_url, gateway.pid)]  # fmt: skip
        if before is not None:
            config = launch.gateway_config(launch.free_port(), [entry])
            old = _gateway("before", config, log_dir, relay_cpu, before)
            started.append(old)
            targets.append(Target("before", old.base_url, old.pid))
        spec = LoadSpec(base_url="", model="zero", prompt_tokens=64, output_tokens=16, api_key=launch.BENCH_API_KEY)
        ttft = {
            # each recorded request follows one of its own path, as a client's next request does
            "back_to_back": asyncio.run(interleaved_ttft(spec, targets, rounds=rounds, lead=1)),
            # the definition before session 10: follows another path's request (the rotation decides which)
            "back_to_back_after_others": asyncio.run(interleaved_ttft(spec, targets, rounds=rounds)),
            "gap_200ms": asyncio.run(interleaved_ttft(spec, targets, rounds=max(rounds // 4, 10), gap_s=0.2)),
        }
        spec = dataclasses.replace(spec, output_tokens=CHUNKS)
        cpu = {}
        for c in levels:
            requests = max(8, 2 * c) if quick else max(16, 4 * c)
            cpu[f"c{c}"] = asyncio.run(throughput_rounds(spec, targets, concurrency=c, num_requests=requests, rounds=3))
    finally:
        for served in reversed(started):
            served.stop()
    return {
        "pinning": {"upstream": upstream_cpu, "relays": relay_cpu, "loadgen": sorted(loadgen or ())},
        "load": {"chunks_per_request": CHUNKS, "ttft_output_tokens": 16, "ttft_rounds": rounds},
        "ttft": ttft,
        "throughput": cpu,
        "headline": headline(ttft, cpu, [t.label for t in targets[2:]]),
    }


def headline(ttft: dict[str, Any], cpu: dict[str, Any], relays: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label in ("floor", *relays):
        row: dict[str, Any] = {}
        for level, result in cpu.items():
            per_1k = result[label]["relay_cpu_s_per_1k_chunks"]
            floor = result["floor"]["relay_cpu_s_per_1k_chunks"]
            row[f"cpu_s_per_1k_chunks_{level}"] = per_1k
            row[f"cpu_ratio_to_floor_{level}"] = per_1k / floor if per_1k and floor else None
            row[f"requests_per_s_{level}"] = result[label]["summary"]["request_throughput"]
        for mode, result in ttft.items():
            added = result[label]["added_ttft_ms_paired_p50"]
            row[f"added_ttft_ms_{mode}"] = added
            floor_added = result["floor"]["added_ttft_ms_paired_p50"]
            row[f"added_ttft_ms_vs_floor_{mode}"] = (
                None if added is None or floor_added is None else added - floor_added
            )
        out[label] = row
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.relay_seam", description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, default=None, help="another checkout's root, measured in the same run")
    p.add_argument("--rounds", type=int, default=200, help="TTFT rounds back to back (a quarter with 200 ms gaps)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    p.add_argument("--log-dir", type=Path, default=Path("bench/out/logs"))
    p.add_argument("--output", type=Path, required=True)
    args = p.parse_args(argv)
    result = {"meta": provenance.collect(), **run(args.log_dir, before=args.before, rounds=args.rounds,
                                                   quick=args.quick, levels=args.concurrency)}  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["headline"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
