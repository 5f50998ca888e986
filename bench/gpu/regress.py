"""The standing GPU regression benchmark (`make bench-gpu`, `python -m bench.gpu.regress`): our engines beside
the reference servers with the exact same choice, ABBA order, one table with the previous committed run beside it.

On the GPU machine (one H200 held to a V100's memory with `.gpu/hold_memory.py`; bench/gpu/run_regress.sh sets
it up and runs this detached), each pair is measured A, B, B, A, every phase a fresh server:

- `worker-q4_k_m`, `worker-q8_0`: our llama.cpp worker vs `llama-server --cache-ram 0`, random-weight Llama-2-7B
  GGUF, every layer on the GPU, 16 slots of 1,024 tokens, KV q8_0, flash attention, at 1/8/16 streams (16 GB);
- `turbomind`: TurboMind FP16 through the gateway vs the same `lmdeploy serve api_server` argv started
  directly, at 1/8/32/64 streams (32 GB);
- `plan-16gb`: the 16 GB plan for 8 x 4,096 sessions through the gateway vs llama-server started with the
  plan's own choice (model file, slots, context, KV type, layers), at 1/8 streams (16 GB);
- `moe-experts`: a random-weight Qwen3-30B-A3B-shape MoE (Q4_0), the routed experts of 16 of 48 blocks in host
  memory: our worker (`--n-cpu-moe 16`) vs `llama-server --n-cpu-moe 16`, 8 slots, at 1/8 streams (16 GB);
  `moe-experts-threads` and `moe-experts-repack`, the same with both on the physical cores (and the worker with
  llama.cpp's CPU weight repacking): what each of the two differences of 2026-12-06's 0.76x explains.

Load: `bench.loadgen` closed loop on `/v1/completions`, 256 tokens out (`ignore_eos`), prompts of 72-296 words
(about 128-524 tokens with the synthetic tokenizer). `--smoke` runs the same machinery on this CPU with the
embedded SmolLM2: the worker vs llama-server (when a `llama-server` binary is on PATH; "not run" otherwise) and
the gateway vs the worker argv it launched, started directly (the TurboMind pair's mechanics).

Output: `OUT/regress.json` and `OUT/regress.md` (the table, `bench.gpu.regress_table`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import yaml

from backends.llamacpp.cpu_features import EXTRA_BUFTS_ENV
from bench import provenance
from bench.gpu.regress_table import (
    LevelMeasure,
    Phase,
    abba_order,
    attach_previous,
    build_rows,
    find_previous,
    phases_from_log,
    render_markdown,
)
from bench.launch import BENCH_API_KEY, Served, default_model_path, start_gateway
from bench.loadgen import LoadSpec, sweep
from bench.processes import REPO, ManagedProcess, free_port, python

G = Path("/tmp/gpu")
RESULTS = REPO / "bench" / "results"
V100_16GB_MIB = 16160
V100_32GB_MIB = 32510
Starter = Callable[[Path], Served]


@dataclass
class Pair:
    """Two servers measured side by side. `b` is None when B cannot run here (`b_missing` says why)."""

    name: str
    a_label: str
    a: Starter
    b_label: str
    b: Starter | None
    levels: tuple[int, ...]
    load: LoadSpec
    hold_free_mib: int | None = None
    requests: int | None = None  # per level; None: loadgen's max(16, 2 x streams)
    b_missing: str = ""
    captured: dict[str, Any] = field(default_factory=dict)  # what A's phase learnt (the engine's argv)


def worker_argv(
    model: Path, name: str, port: int, *, slots: int, ctx: int, gpu: bool, threads: int | None, n_cpu_moe: int = 0
) -> list[str]:
    """Our worker as the regression runs it: every layer on the GPU with KV q8_0 (or the CPU defaults); a MoE's
    routed experts of the first `n_cpu_moe` blocks in host memory."""
    argv = [python(), "-m", "backends.llamacpp.worker", "--model", str(model), "--model-name", name,
            "--host", "127.0.0.1", "--port", str(port), "--ctx", str(ctx), "--slots", str(slots),
            "--max-queue", "256"]  # fmt: skip
    if gpu:
        argv += ["--n-gpu-layers", "-1", "--cache-type", "q8_0"]
    if threads:
        argv += ["--n-threads", str(threads)]
    if n_cpu_moe:
        argv += ["--n-cpu-moe", str(n_cpu_moe)]
    return argv


def _flag(argv: Sequence[str], name: str, default: str | None = None) -> str | None:
    for i, arg in enumerate(argv[:-1]):
        if arg == name:
            return argv[i + 1]
    return default


def llama_server_argv(worker: Sequence[str], port: int, binary: str = "llama-server") -> list[str]:
    """llama-server with the same choice as a worker command line: model, slots, context per slot (llama-server's
    `-c` is the total, split over `-np`), layers, KV type, flash attention, threads; its host prompt cache off."""
    slots = int(_flag(worker, "--slots", "1") or 1)
    ctx = int(_flag(worker, "--ctx", "4096") or 4096)
    layers = _flag(worker, "--n-gpu-layers", "0")
    cache = _flag(worker, "--cache-type", "auto") or "auto"
    if cache == "auto":  # the worker's auto: bf16 on the CPU, f16 with layers on a GPU
        cache = "bf16" if layers == "0" else "f16"
    argv = [binary, "-m", str(_flag(worker, "--model")), "--alias", str(_flag(worker, "--model-name")),
            "--host", "127.0.0.1", "--port", str(port), "-np", str(slots), "-c", str(slots * ctx),
            "-ngl", _layers(layers),
            "-b", str(_flag(worker, "--n-batch", "512")), "-ctk", cache, "-ctv", cache,
            "-fa", "off" if "--no-flash-attn" in worker else "on", "--cache-ram", "0"]  # fmt: skip
    threads = _flag(worker, "--n-threads")
    if threads:
        argv += ["-t", threads]
    moe = _flag(worker, "--n-cpu-moe")
    if moe:
        argv += ["--n-cpu-moe", moe]
    return argv


def _layers(n_gpu_layers: str | None) -> str:
    """llama-server's `-ngl` for the worker's `--n-gpu-layers` (-1 = all: 999)."""
    return "999" if n_gpu_layers == "-1" else str(n_gpu_layers or "0")


def with_port(argv: Sequence[str], port: int) -> list[str]:
    """`argv` with its `--port`/`--server-port` value replaced (an engine command line a gateway launched)."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg in ("--port", "--server-port"):
            out[i + 1] = str(port)
    return out


def _served(
    name: str, argv: list[str], log_dir: Path, health: str, model: str, env: dict[str, str] | None = None
) -> Served:
    port = int(_flag(argv, "--port") or _flag(argv, "--server-port") or 0)
    proc = ManagedProcess(name, argv, log_dir=log_dir, env=env).start()
    root = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(root + health, 900)
    except BaseException:
        proc.stop()
        raise
    return Served(proc, root, model, {"argv": argv})


def start_worker_direct(
    model: Path, name: str, *, slots: int, ctx: int, gpu: bool, threads: int | None, n_cpu_moe: int = 0,
    env: dict[str, str] | None = None,
) -> Starter:  # fmt: skip
    def start(log_dir: Path) -> Served:
        argv = worker_argv(model, name, free_port(), slots=slots, ctx=ctx, gpu=gpu, threads=threads,
                           n_cpu_moe=n_cpu_moe)  # fmt: skip
        return _served("worker", argv, log_dir, "/health", name, env)

    return start


def start_llama_server(worker: Callable[[], list[str]], name: str, binary: str) -> Starter:
    """llama-server from the worker command line `worker()` returns (the same choice, its own port)."""

    def start(log_dir: Path) -> Served:
        return _served("llama-server", llama_server_argv(worker(), free_port(), binary), log_dir, "/health", name)

    return start


def engine_child(gateway_pid: int, marker: str) -> tuple[list[str], dict[str, str]]:
    """The command line and the CUDA settings of the engine process a gateway launched (the first descendant
    whose argv has `marker`), so B can start it exactly so; the worker's launch secret is left behind."""
    for child in psutil.Process(gateway_pid).children(recursive=True):
        cmdline = child.cmdline()
        if any(marker in arg for arg in cmdline):
            env = {k: v for k, v in child.environ().items() if k.startswith("CUDA_")}
            return cmdline, env
    raise RuntimeError(f"no process with {marker!r} under gateway pid {gateway_pid}")


def start_gateway_capturing(config_path: Path, pair: Pair, marker: str, *, gpus: str) -> Starter:
    """The gateway on `config_path` (server port replaced); records its engine's argv in `pair.captured`."""

    def start(log_dir: Path) -> Served:
        config = yaml.safe_load(config_path.read_text())
        config["server"] = {**config.get("server", {}), "host": "127.0.0.1", "port": free_port()}
        if gpus:
            config["gpus"] = gpus
        served = start_gateway("gateway", config, log_dir=log_dir, timeout_s=900, gpus=bool(gpus))
        pair.captured["argv"], pair.captured["env"] = engine_child(served.pid, marker)
        pair.captured["model"] = served.model
        return served

    return start


def start_captured(pair: Pair, health: str) -> Starter:
    """The engine argv the gateway launched in A's phase, started directly on a port of its own."""

    def start(log_dir: Path) -> Served:
        argv = with_port(pair.captured["argv"], free_port())
        return _served("direct", argv, log_dir, health, pair.captured["model"], pair.captured["env"])

    return start


def gpu_pairs(load: LoadSpec, llama_server: str | None) -> list[Pair]:
    """The GPU machine's four pairs (models from bench/gpu/run_regress.sh under /tmp/gpu)."""
    pairs = []
    for quant in ("q4_k_m", "q8_0"):
        model = G / "gguf" / f"7b-{quant}.gguf"
        argv = worker_argv(model, "llama2-7b", 0, slots=16, ctx=1024, gpu=True, threads=None)
        pair = Pair(f"worker-{quant}", "worker", start_worker_direct(model, "llama2-7b", slots=16, ctx=1024,
                    gpu=True, threads=None), "llama-server", None, (1, 8, 16), load, V100_16GB_MIB)  # fmt: skip
        if llama_server:
            pair.b = start_llama_server(lambda argv=argv: argv, "llama2-7b", llama_server)
        pairs.append(pair)
    tm = Pair("turbomind", "gateway", _unset, "lmdeploy direct", None, (1, 8, 32, 64), load, V100_32GB_MIB)
    tm.a = start_gateway_capturing(REPO / "bench/gpu/configs/regress-tm-7b-32gb.yaml", tm, "api_server", gpus="auto")
    tm.b = start_captured(tm, "/v1/models")
    plan = Pair("plan-16gb", "gateway", _unset, "llama-server", None, (1, 8), load, V100_16GB_MIB)
    plan.a = start_gateway_capturing(REPO / "bench/gpu/configs/pvm-plan-16gb.yaml", plan, "backends.llamacpp.worker",
                                     gpus="auto")  # fmt: skip
    if llama_server:
        plan.b = start_llama_server(lambda: list(plan.captured["argv"]), "llama2-7b", llama_server)
    cores = psutil.cpu_count(logical=False) or None
    pairs += [tm, plan, _moe_pair(load, llama_server), _moe_pair(load, llama_server, "moe-experts-threads", cores),
              _moe_pair(load, llama_server, "moe-experts-repack", cores, {EXTRA_BUFTS_ENV: "on"})]  # fmt: skip
    for p in pairs:
        if p.b is None:
            p.b_missing = "not run: no llama-server binary"
    return pairs


MOE_HOST_BLOCKS = 16
ONLY_WHEN_NAMED = ("moe-experts-threads", "moe-experts-repack")
"""The `moe-experts` pair's split: the routed experts of 16 of 48 blocks (5.4 GB) in host memory, ~11 GB on the
GPU held to 16 GB."""


def _moe_pair(
    load: LoadSpec, llama_server: str | None, name: str = "moe-experts", threads: int | None = None,
    env: dict[str, str] | None = None,
) -> Pair:  # fmt: skip
    """Experts in host memory (issue 39): our worker vs `llama-server --n-cpu-moe` at the same split, on the
    random-weight Qwen3-30B-A3B-shape GGUF (bench/gpu/make_moe_gguf.py), 8 slots of 1,024 tokens, 16 GB.
    `moe-experts` runs both as shipped (bc76834: 0.76x / 0.85x, the worker on 8 host threads, half the logical
    CPUs, where llama-server took 16, and without CPU weight repacking; since 2026-12-06 the worker too takes one
    thread per physical core); `moe-experts-threads` gives both the host's physical cores explicitly;
    `moe-experts-repack` that, and the worker llama.cpp's extra CPU buffer types (`VOLTGATE_LLAMA_EXTRA_BUFTS=on`,
    which it turns off by default on AMX hosts: llama.cpp #20824)."""
    model = G / "gguf" / "moe-q4_0.gguf"
    options: dict[str, Any] = {"slots": 8, "ctx": 1024, "gpu": True, "threads": threads, "n_cpu_moe": MOE_HOST_BLOCKS}
    pair = Pair(name, "worker", start_worker_direct(model, "qwen3-30b-a3b-shape", **options, env=env),
                "llama-server", None, (1, 8), load, V100_16GB_MIB)  # fmt: skip
    if llama_server:
        argv = worker_argv(model, "qwen3-30b-a3b-shape", 0, **options)
        pair.b = start_llama_server(lambda: argv, "qwen3-30b-a3b-shape", llama_server)
    return pair


def _unset(_: Path) -> Served:
    raise AssertionError("starter not set")


def smoke_pairs(load: LoadSpec, llama_server: str | None, threads: int) -> list[Pair]:
    """The CPU smoke: the embedded SmolLM2, 4 slots of 1,024 tokens, 1 and 4 streams."""
    model = default_model_path()
    argv = worker_argv(model, "smollm2-135m", 0, slots=4, ctx=1024, gpu=False, threads=threads)
    worker = Pair("worker-smollm2", "worker", start_worker_direct(model, "smollm2-135m", slots=4, ctx=1024, gpu=False,
                  threads=threads), "llama-server", None, (1, 4), load)  # fmt: skip
    if llama_server:
        worker.b = start_llama_server(lambda: argv, "smollm2-135m", llama_server)
    else:
        worker.b_missing = "not run: no llama-server on PATH"
    gw = Pair("gateway-smollm2", "gateway", _unset, "worker direct", None, (1, 4), load)
    config = {"server": {"host": "127.0.0.1", "port": 0}, "gpus": "none", "models": [
        {"name": "smollm2-135m", "sources": [{"gguf": str(model)}], "context": 1024, "concurrency": 4,
         "engine": "llamacpp", "llamacpp": {"slots": 4, "n_threads": threads, "max_queue": 256}}]}  # fmt: skip
    gw.captured["config"] = config
    gw.a = _smoke_gateway(gw)
    gw.b = start_captured(gw, "/health")
    return [worker, gw]


def _smoke_gateway(pair: Pair) -> Starter:
    """The gateway on the smoke config (written into the phase's log folder)."""

    def start(log_dir: Path) -> Served:
        path = log_dir / "smoke-gateway.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(pair.captured["config"]))
        return start_gateway_capturing(path, pair, "backends.llamacpp.worker", gpus="")(log_dir)

    return start


class MemoryHold:
    """`.gpu/hold_memory.py --leave-free-mib N` for the phases that need it (one hold at a time)."""

    def __init__(self, script: Path | None, log_dir: Path) -> None:
        self.script, self.log_dir = script, log_dir
        self._proc: ManagedProcess | None = None
        self._mib: int | None = None

    def set(self, mib: int | None) -> None:
        if mib == self._mib or self.script is None:
            return
        self.release()
        if mib is not None:
            argv = ["python3", str(self.script), "--leave-free-mib", str(mib)]
            self._proc = ManagedProcess(f"hold-{mib}", argv, log_dir=self.log_dir).start()
            deadline = time.monotonic() + 120
            while "holding" not in self._proc.log_tail() and time.monotonic() < deadline:
                time.sleep(0.5)
            self._mib = mib

    def release(self) -> None:
        if self._proc is not None:
            self._proc.stop()
        self._proc, self._mib = None, None


async def measure(served: Served, pair: Pair) -> tuple[LevelMeasure, ...]:
    spec = replace(pair.load, base_url=served.base_url, model=served.model, api_key=BENCH_API_KEY)
    levels = await sweep(spec, concurrencies=pair.levels, num_requests=pair.requests, warmup=2, label=pair.name)
    out = []
    for lv in levels:
        s = lv.summary
        out.append(LevelMeasure(lv.concurrency or 0, s["output_throughput"], s["ttft_ms"]["p50"], s["completed"],
                                s["requests"]))  # fmt: skip
    return tuple(out)


def run_pairs(pairs: Sequence[Pair], log_dir: Path, hold: MemoryHold) -> list[Phase]:
    """Every pair in ABBA order (A, A when B cannot run), each phase a fresh server; a phase that fails to
    start or measure is logged and left out, never the whole run."""
    phases: list[Phase] = []
    order = 0
    for pair in pairs:
        for _, side in abba_order([pair.name], b_runs=pair.b is not None):
            starter = pair.a if side == "A" else pair.b
            assert starter is not None
            hold.set(pair.hold_free_mib)
            label = pair.a_label if side == "A" else pair.b_label
            print(f"== {pair.name} {side} ({label})", file=sys.stderr, flush=True)
            try:
                served = starter(log_dir / f"{order:02d}-{pair.name}-{side}")
                try:
                    levels = asyncio.run(measure(served, pair))
                finally:
                    served.stop()
            except Exception as exc:  # a bench keeps going: the table shows the phase as missing
                print(f"   {pair.name} {side} failed: {exc}", file=sys.stderr, flush=True)
                order += 1
                continue
            phases.append(Phase(pair.name, side, label, order, levels))
            order += 1
    hold.release()
    return phases


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.gpu.regress", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="result folder (commit it under bench/results/)")
    p.add_argument("--smoke", action="store_true", help="this CPU, the embedded SmolLM2 (checks the machinery)")
    p.add_argument("--only", nargs="+", help="pair names to run, in this order (default: all but the MoE variants)")
    p.add_argument("--llama-server", default=shutil.which("llama-server"), help="binary (default: from PATH)")
    p.add_argument("--hold-script", type=Path, default=REPO / ".gpu" / "hold_memory.py")
    p.add_argument("--output-tokens", type=int, help="default 256 (smoke: 16)")
    p.add_argument("--requests", type=int, help="requests per level (default max(16, 2 x streams); smoke 4)")
    p.add_argument("--threads", type=int, default=2, help="smoke: CPU threads of each server")
    p.add_argument("--notes", default="")
    p.add_argument("--from-log", type=Path, help="no run: the table of a run that ended before writing it, from "
                   "its run.log (the phases and levels it printed)")  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_log is not None:
        return _write(args.out, phases_from_log(args.from_log.read_text()), {}, "gpu", {"from_log": str(args.from_log)})
    words, ratio, out_tokens = (40, 0.5, 16) if args.smoke else (184, 0.61, 256)
    load = LoadSpec(base_url="", model="", prompt_tokens=words, output_tokens=args.output_tokens or out_tokens,
                    range_ratio=ratio, seed=34)  # fmt: skip
    pairs = smoke_pairs(load, args.llama_server, args.threads) if args.smoke else gpu_pairs(load, args.llama_server)
    if args.only:  # in the order named: what matters most runs first on a machine that may be taken back
        by_name = {p.name: p for p in pairs}
        pairs = [by_name[n] for n in args.only if n in by_name]
    else:  # the MoE pair's diagnostic variants run only when named
        pairs = [p for p in pairs if p.name not in ONLY_WHEN_NAMED]
    load_requests = args.requests or (4 if args.smoke else None)
    for pair in pairs:
        pair.requests = load_requests
    meta = provenance.collect(notes=args.notes, gpu=_gpu_name(), code=_code())
    hold = MemoryHold(None if args.smoke else args.hold_script, args.out / "logs")
    phases = run_pairs(pairs, args.out / "logs", hold)
    mode = "smoke" if args.smoke else "gpu"
    b_status = {p.name: p.b_missing for p in pairs if p.b is None}
    run = {"meta": meta, "load": load.describe(), "requests_per_level": load_requests}
    return _write(args.out, phases, b_status, mode, run)


def _write(out: Path, phases: list[Phase], b_status: dict[str, str], mode: str, run: dict[str, Any]) -> int:
    """regress.json and regress.md in `out`, the previous committed run beside; 1 when nothing was measured."""
    rows = build_rows(phases, b_status)
    beside: dict[Path, list[str]] = {}
    for pair in dict.fromkeys(r.pair for r in rows):  # each pair beside the newest run that measured it
        found = find_previous(RESULTS, exclude=out, mode=mode, pair=pair)
        if found is not None:
            attach_previous([r for r in rows if r.pair == pair], json.loads(found.read_text()))
            beside.setdefault(found, []).append(pair)
    previous = [(", ".join(pairs), str(path.relative_to(REPO)), _commit(path)) for path, pairs in beside.items()]
    rel = previous[0][1] if previous else None
    table = render_markdown(rows, previous=previous)
    order = [f"{ph.pair}:{ph.side}" for ph in sorted(phases, key=lambda ph: ph.order)]
    result = {"kind": "gpu-regress", "mode": mode, **run, "order": order, "previous": rel,
              "previous_by_pair": {pair: p[1] for p in previous for pair in p[0].split(", ")},
              "rows": [r.to_json() for r in rows], "phases": [_phase_json(ph) for ph in phases]}  # fmt: skip
    (out / "regress.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "regress.md").write_text(f"# GPU regression ({mode})\n\n{table}")
    print(table)
    return 0 if phases else 1


def _code() -> str | None:
    """The commit this checkout is (`bench/gpu/.tree`, written before a device call, or `VG_COMMIT`): on the GPU
    machine git's own answer is the device copy's stale `.git` (2026-12-06: 049753e, dirty, for code 72036c3)."""
    tree = REPO / "bench" / "gpu" / ".tree"
    text = tree.read_text().strip() if tree.is_file() else os.environ.get("VG_COMMIT", "")
    return text or None


def _commit(path: Path) -> str | None:
    """A previous run's code: its `meta.code` where it has one, else what git said there."""
    meta = json.loads(path.read_text()).get("meta", {})
    return meta.get("code") or meta.get("git", {}).get("commit")


def _phase_json(phase: Phase) -> dict[str, Any]:
    return {"pair": phase.pair, "side": phase.side, "label": phase.label, "order": phase.order,
            "levels": [vars(lv) for lv in phase.levels]}  # fmt: skip


def _gpu_name() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


if __name__ == "__main__":
    raise SystemExit(main())
