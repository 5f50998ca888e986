"""Model swapping on the GPU machine: two on-demand models that cannot both fit, requests alternating between
them through `voltgate serve`; swap times, measured memory and errors to one JSON file.

    python -m bench.gpu.swap --config bench/gpu/configs/swap-7b.yaml --output RESULTS/swap.json [--rounds 4]

It runs `voltgate plan --json` (each model must swap and the two must not fit together), starts
`voltgate serve`, and then, per round and per model in turn: one streamed chat request (timed: headers, first
token, end; its SSE comments kept, which say what the load waited for) with `--concurrency - 1` more requests
for the same model sent at the same moment (they must share the one load), then `/admin/models`, the residency
metrics and NVML's view of the GPUs. Last, a busy swap: a long request on one model while the other is asked
for (the second must wait for the first to finish: nothing is killed). Exits non-zero if any request failed.
Needs only httpx (and pynvml, optional, for the GPU snapshots); the gateway must be startable as
`python3 -m gateway` from the current directory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

PROMPT = "Tell me about the history of the V100 graphics card in detail."


def nvml_snapshot() -> list[dict[str, Any]]:
    """Used and free memory per GPU (MiB), as NVML reports it; [] without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no NVML here: no snapshot
        return []
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        mem = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i))
        out.append({"gpu": i, "used_mib": mem.used >> 20, "free_mib": mem.free >> 20, "total_mib": mem.total >> 20})
    return out


def residency_metrics(root: str) -> dict[str, float]:
    """The residency series from /metrics (loads, evictions, load duration sums and counts)."""
    text = httpx.get(root + "/metrics", timeout=10).text
    wanted = ("voltgate:model_loads_total", "voltgate:model_evictions_total", "voltgate:model_load_duration_seconds_")
    out = {}
    for line in text.splitlines():
        if line.startswith(wanted) and not line.endswith("_bucket"):
            name, _, value = line.rpartition(" ")
            if "_bucket{" not in name:
                out[name] = float(value)
    return out


def admin(root: str) -> dict[str, Any]:
    response = httpx.get(root + "/admin/models", timeout=30)
    response.raise_for_status()
    data: dict[str, Any] = response.json()
    return data


async def timed_stream(client: httpx.AsyncClient, root: str, model: str, max_tokens: int) -> dict[str, Any]:
    """One streamed chat request: seconds to headers, to the first token and to the end; comments; errors."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    entry: dict[str, Any] = {"model": model}
    first_token = None
    comments: list[str] = []
    errors: list[Any] = []
    tokens = None
    try:
        async with client.stream("POST", root + "/v1/chat/completions", json=body) as response:
            entry["status"] = response.status_code
            entry["headers_s"] = round(time.perf_counter() - started, 3)
            if response.status_code != 200:
                entry["error"] = (await response.aread()).decode(errors="replace")[:1000]
                return entry
            async for line in response.aiter_lines():
                if line.startswith(":"):
                    comments.append(line[:300])
                elif line.startswith("data: {"):
                    data = json.loads(line[6:])
                    if "error" in data:
                        errors.append(data["error"])
                    elif data.get("usage"):
                        tokens = data["usage"].get("completion_tokens")
                    elif first_token is None and any((c.get("delta") or {}).get("content") for c in data["choices"]):
                        first_token = time.perf_counter() - started
    except httpx.HTTPError as exc:
        entry["error"] = f"{type(exc).__name__}: {exc}"
    entry.update(
        first_token_s=round(first_token, 3) if first_token is not None else None,
        total_s=round(time.perf_counter() - started, 3),
        completion_tokens=tokens,
        comments=comments[:20],
        errors=errors,
    )
    if errors and "error" not in entry:
        entry["error"] = errors[0].get("message")
    return entry


async def swap_round(root: str, model: str, concurrency: int, max_tokens: int) -> dict[str, Any]:
    """One model asked for while (usually) the other is loaded: the timed stream plus companions."""
    before = admin(root)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0, connect=10.0)) as client:
        results = await asyncio.gather(
            timed_stream(client, root, model, max_tokens),
            *(timed_stream(client, root, model, max_tokens) for _ in range(concurrency - 1)),
        )
    after = admin(root)
    states_before = {m["model"]: m["state"] for m in before["data"]}
    return {
        "model": model,
        "was": states_before.get(model),
        "resident_before": sorted(n for n, s in states_before.items() if s == "ready"),
        "timed": results[0],
        "companions": [{k: r.get(k) for k in ("status", "first_token_s", "total_s", "error")} for r in results[1:]],
        "failed": sum(1 for r in results if r.get("status") != 200 or r.get("error")),
        "admin": {
            m["model"]: {k: m.get(k) for k in ("state", "memory", "loads", "last_load_s", "error")}
            for m in after["data"]
        },
        "pools": after.get("memory"),
        "nvml": nvml_snapshot(),
        "metrics": residency_metrics(root),
    }


async def busy_swap(root: str, busy: str, other: str) -> dict[str, Any]:
    """A long request on `busy` while `other` is asked for: `other` must wait for it (drain), not kill it."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0, connect=10.0)) as client:
        long = asyncio.ensure_future(timed_stream(client, root, busy, 512))
        deadline = time.monotonic() + 600
        while not long.done() and time.monotonic() < deadline:
            listed = (await client.get(root + "/admin/models")).json()["data"]
            model: dict[str, Any] = next((m for m in listed if m["model"] == busy), {})
            if model.get("in_flight"):
                break
            await asyncio.sleep(0.2)
        asked_at = time.perf_counter()
        second = await timed_stream(client, root, other, 16)
        waited = time.perf_counter() - asked_at
        finished_first = long.done()  # the busy request ended before the other model answered
        long_result = await long
    complete = long_result.get("completion_tokens") == 512
    return {
        "busy": long_result,
        "other": second,
        "other_waited_s": round(waited, 3),
        "busy_finished_first": finished_first and complete,
    }


def start_gateway(config: Path, gpus: str | None, log_path: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(config)] + (["--gpus", gpus] if gpus else [])
    log = log_path.open("wb")
    return subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )


def wait_ready(root: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited with {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(root + "/ready", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError("gateway not ready")


def plan(config: Path, gpus: str | None) -> dict[str, Any]:
    argv = [sys.executable, "-m", "gateway", "plan", "--config", str(config), "--json"] + (
        ["--gpus", gpus] if gpus else []
    )
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300).stdout
    report: dict[str, Any] = json.loads(out)
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--gpus", default=None, help="passed to voltgate (default: the config's, e.g. auto)")
    ap.add_argument("--output", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=4, help="times each model is asked for in turn")
    ap.add_argument("--concurrency", type=int, default=4, help="requests sent together for the model asked for")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--ready-timeout-s", type=float, default=600)
    args = ap.parse_args()
    root = f"http://127.0.0.1:{args.port}"
    args.output.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"config": str(args.config), "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    report = plan(args.config, args.gpus)
    swapping = [d for d in report["decisions"] if d.get("residency") == "swaps"]
    result["plan"] = [
        {k: d.get(k) for k in ("model", "load", "residency", "co_resident", "rung", "source", "refusal")}
        | {"estimate_gib": (d.get("estimate") or {}).get("terms_gib")}
        for d in report["decisions"]
    ]
    result["plan_residency"] = report.get("residency")
    models = [d["model"] for d in swapping]
    if len(models) < 2 or any(d["co_resident"] for d in swapping):
        result["warning"] = "the config should have two on-demand models that cannot both be loaded"
    result["nvml_before"] = nvml_snapshot()
    log_path = args.output.with_suffix(".gateway.log")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so the gateway (its own session) is stopped too
    process = start_gateway(args.config, args.gpus, log_path)
    try:
        wait_ready(root, process, args.ready_timeout_s)
        result["nvml_ready"] = nvml_snapshot()
        rounds: list[dict[str, Any]] = []
        result["rounds"] = rounds  # filled as it goes: a run cut short still reports its rounds
        for i in range(args.rounds):
            for model in models[:2]:
                entry = asyncio.run(swap_round(root, model, args.concurrency, args.max_tokens))
                entry["round"] = i
                rounds.append(entry)
                print(
                    json.dumps(
                        {k: entry[k] for k in ("round", "model", "was", "failed")}
                        | {"first_token_s": entry["timed"].get("first_token_s")}
                    ),
                    flush=True,
                )
        if len(models) >= 2:
            result["busy_swap"] = asyncio.run(busy_swap(root, models[0], models[1]))
        result["final_admin"] = admin(root)
        result["metrics"] = residency_metrics(root)
    except (Exception, SystemExit) as exc:  # a bench run (or a SIGTERM from a time limit) reports what it had
        result["fatal"] = f"{type(exc).__name__}: {exc}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        result["nvml_after"] = nvml_snapshot()
    result["summary"] = summarize(result)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"]), flush=True)
    return 1 if result.get("fatal") or result["summary"]["failed_requests"] else 0


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Swap times per model (first token of the timed request when the other model was loaded), errors,
    loads and the memory each model was measured at, next to its estimate."""
    rounds = result.get("rounds", [])
    swaps: dict[str, list[float]] = {}
    for entry in rounds:
        first = entry["timed"].get("first_token_s")
        if entry["was"] != "ready" and first is not None:
            swaps.setdefault(entry["model"], []).append(first)
    memory = {}
    for m in (result.get("final_admin") or {}).get("data", []):
        memory[m["model"]] = m.get("memory")
    busy = result.get("busy_swap") or {}
    return {
        "swap_first_token_s": {m: sorted(v) for m, v in swaps.items()},
        "failed_requests": sum(e["failed"] for e in rounds)
        + sum(1 for r in (busy.get("busy"), busy.get("other")) if r and (r.get("status") != 200 or r.get("error"))),
        "busy_finished_first": busy.get("busy_finished_first"),
        "loads": {k: v for k, v in (result.get("metrics") or {}).items() if "loads_total" in k},
        "evictions": {k: v for k, v in (result.get("metrics") or {}).items() if "evictions_total" in k},
        "memory": memory,
        "fatal": result.get("fatal"),
    }


if __name__ == "__main__":
    sys.exit(main())
