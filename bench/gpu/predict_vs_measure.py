"""Issue #16: the plan's predicted speed against what `voltgate serve` really delivers, scenario by scenario.

    python3 -m bench.gpu.predict_vs_measure run --scenarios bench/gpu/configs/pvm-scenarios.yaml \\
        [--only NAME ...] --gpus auto --out-dir DIR [--hold-script .gpu/hold_memory.py]
    python3 -m bench.gpu.predict_vs_measure report DIR/predict_vs_measure.json [...] --out-dir DIR2

`run`, for each scenario (a voltgate config, the concurrency levels to measure, and the free GPU memory to
leave with hold_memory.py): holds the memory, takes the plan's prediction from `voltgate plan --json --gpus G`
(on the GPU machine `--gpus auto`, so NVML's real name and free memory are used), starts `voltgate serve`,
runs bench.loadgen's closed loop at each level (`--prompt-tokens` words, `--output-tokens` tokens with
ignore_eos, max(`--min-requests`, 2 x level) requests; a scenario may set its own `output_tokens` and
`min_requests`), stops the gateway and the hold, and writes
`predict_vs_measure.json` and `.md` into the out dir (rows are added to files already there, so one out dir
can collect several runs). `report` merges result JSONs into one table.

What each prediction is, from the plan's `prediction` (gateway/placement/performance.py):
- level 1: `decode_tok_s_1` (per stream = aggregate);
- the plan's own `sessions` (min(concurrency, what the placement holds)): `decode_tok_s_per_stream`,
  `aggregate_tok_s`; its `capacity_sessions`: `capacity_tok_s`;
- any other level L: the plan of the same config with `concurrency: L` (its deployment must be the served
  one's: engine, file, layers, KV type and tp are compared and a difference is reported in the row).
  A level above what the placement holds is predicted at that many (the rest queue in the gateway).
The table's predicted numbers are the served plan's prediction recomputed from its `inputs` for this load
(`Prediction.per_stream_at`, `Prediction.ttft_at`: the same formulas as the plan, no second model):
- per stream: at the level's sessions, each as long as the load's mean prompt + half its output (the plan
  reads KV at the full configured `context`, the speed it promises for full sessions; those numbers are kept
  in each row as `plan_per_stream` and `plan_aggregate`); aggregate = per stream x sessions;
- TTFT: at one stream, the request overhead plus the prompt's prefill; at more, the burst bound
  (`ttft_at(..., ahead=sessions - 1)`: the overhead plus the prefill of every prompt of a wave that arrives
  together). Only the closed loop's first wave arrives that way; later requests come spread out and wait for
  little more than their own prefill, so the measured p50 lies between the idle TTFT and this bound.
Measured: per-stream decode tok/s is the mean over requests of (output tokens - 1) / (end - first token);
aggregate is output tokens / level wall time; TTFT is the p50.
Ratio = measured / predicted; `within_25pct` when |ratio - 1| <= 0.25.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.loadgen import LoadSpec, sweep
from gateway.placement.performance import Prediction

TOLERANCE = 0.25
NONE = "-"
DEPLOYMENT_KEYS = ("engine", "source_path", "quant", "n_gpu_layers", "kv_cache_type", "tp", "gpu_indices")


def log(message: str) -> None:
    print(f"[pvm {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def plan_json(python: str, config: Path, gpus: str) -> dict[str, Any]:
    """`voltgate plan --json` for one config; raises with its output when it fails."""
    out = subprocess.run(
        [python, "-m", "gateway", "plan", "--config", str(config), "--gpus", gpus, "--json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"voltgate plan failed ({out.returncode}): {(out.stdout + out.stderr)[-2000:]}")
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def decision(plan: dict[str, Any]) -> dict[str, Any]:
    decisions = plan["decisions"]
    if len(decisions) != 1:
        raise ValueError(f"a scenario's config must hold one model, the plan has {len(decisions)}")
    first: dict[str, Any] = decisions[0]
    return first


def deployment(d: dict[str, Any]) -> dict[str, Any]:
    plan = d.get("plan") or {}
    return {k: plan.get(k) for k in DEPLOYMENT_KEYS}


def with_concurrency(config: Path, level: int, out: Path) -> Path:
    data = yaml.safe_load(config.read_text())
    variant = copy.deepcopy(data)
    variant["models"][0]["concurrency"] = level
    out.write_text(yaml.safe_dump(variant, sort_keys=False))
    return out


def predictions(python: str, config: Path, gpus: str, levels: Sequence[int], work: Path) -> dict[str, Any]:
    """The served plan and, per level, the predicted speeds with where they came from."""
    served = plan_json(python, config, gpus)
    d = decision(served)
    if d.get("refusal") or not d.get("prediction"):
        raise RuntimeError(f"the plan refuses or predicts nothing: {d.get('refusal')}")
    p = d["prediction"]
    per_level: dict[int, dict[str, Any]] = {}
    variants: dict[int, Any] = {}
    for level in levels:
        if level == 1:
            row = {"per_stream": p["decode_tok_s_1"], "aggregate": p["decode_tok_s_1"], "from": "decode_tok_s_1"}
        elif level == p["sessions"]:
            row = {"per_stream": p["decode_tok_s_per_stream"], "aggregate": p["aggregate_tok_s"],
                   "from": f"sessions={p['sessions']}"}  # fmt: skip
        elif level == p["capacity_sessions"]:
            row = {"per_stream": round(p["capacity_tok_s"] / level, 1), "aggregate": p["capacity_tok_s"],
                   "from": f"capacity_sessions={level}"}  # fmt: skip
        else:
            vplan = plan_json(python, with_concurrency(config, level, work / f"{config.stem}-c{level}.yaml"), gpus)
            vd = decision(vplan)
            vp = vd["prediction"]
            row = {"per_stream": vp["decode_tok_s_per_stream"], "aggregate": vp["aggregate_tok_s"],
                   "from": f"plan with concurrency {level} (sessions={vp['sessions']})"}  # fmt: skip
            if deployment(vd) != deployment(d):
                row["deployment_differs"] = {"served": deployment(d), "variant": deployment(vd)}
            variants[level] = {"deployment": deployment(vd), "prediction": vp, "rung": vd.get("rung")}
        row["sessions_predicted"] = min(level, p["capacity_sessions"]) if level > 1 else 1
        row["prefill_tok_s"] = p["prefill_tok_s"]
        per_level[level] = row
    return {"plan": served, "decision": d, "per_level": per_level, "variants": variants}


class Held:
    """hold_memory.py in the background until stopped: a smaller card on the GPU machine's H100 or H200."""

    def __init__(self, python: str, script: Path | None, free_mib: int | None, log_path: Path) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.line = ""
        if script is None or not free_mib:
            return
        self.log_path = log_path
        with open(log_path, "wb") as f:
            self.proc = subprocess.Popen([python, str(script), "--leave-free-mib", str(free_mib)], stdout=f,
                                         stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        for _ in range(240):
            text = log_path.read_text(errors="replace")
            if "holding" in text:
                self.line = text.strip().splitlines()[-1]
                log(self.line)
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"hold_memory.py exited: {text[-500:]}")
            time.sleep(0.25)
        raise RuntimeError("hold_memory.py did not report within 60 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Gateway:
    """`voltgate serve` as a child in its own process group (its workers follow it on SIGTERM)."""

    def __init__(self, python: str, config: Path, gpus: str, port: int, log_path: Path) -> None:
        self.root = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.max_restarts = 2
        argv = [python, "-m", "gateway", "serve", "--config", str(config), "--gpus", gpus, "--port", str(port)]
        self.argv = argv
        with open(log_path, "wb") as f:
            self.proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip

    def wait_ready(self, timeout_s: float) -> float:
        started = time.monotonic()
        with httpx.Client(timeout=5, trust_env=False) as client:
            while time.monotonic() - started < timeout_s:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"voltgate serve exited {self.proc.returncode}: {self.tail(30)}")
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    response = client.get(f"{self.root}/ready")
                    if response.status_code == 200:
                        return time.monotonic() - started
                    # a worker that keeps failing its start will not get ready: stop waiting (its backoff
                    # grows to 60 s, so waiting out the timeout only burns device time)
                    for name, model in (response.json().get("models") or {}).items():
                        if model.get("restarts", 0) >= self.max_restarts and model.get("error"):
                            raise RuntimeError(f"worker {name} failed {model['restarts']} starts: {model['error']}")
                time.sleep(1)
        raise RuntimeError(f"not ready after {timeout_s:.0f} s: {self.tail(30)}")

    def get(self, path: str) -> Any:
        with httpx.Client(timeout=10, trust_env=False) as client:
            response = client.get(f"{self.root}{path}")
            return response.json() if response.status_code == 200 else {"status": response.status_code}

    def tail(self, lines: int) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def gpu_memory() -> list[str]:
    """What nvidia-smi says each process uses (empty without a GPU)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return [line for line in out.stdout.splitlines() if line.strip()]


def ratio(measured: float | None, predicted: float | None) -> float | None:
    if measured is None or not predicted:
        return None
    return round(measured / predicted, 3)


def compare(level: int, pred: dict[str, Any], summary: dict[str, Any], prediction: Prediction,
            output_tokens: int) -> dict[str, Any]:  # fmt: skip
    """One level's row: the served plan's prediction recomputed for this load (module docstring) against what
    was measured; the plan's own full-context numbers are kept as `plan_per_stream` / `plan_aggregate`."""
    done = summary["completed"]
    prompt = summary["prompt_tokens"] / done if done else None
    per_stream = summary["decode_tok_s_per_stream"]["mean"]
    aggregate = summary["output_throughput"] if done else None
    ttft = summary["ttft_ms"]["p50"]
    sessions = pred["sessions_predicted"]
    each = ttft_pred = None
    if prompt:
        each = prediction.per_stream_at(sessions, round(prompt) + output_tokens // 2)
        ttft_pred = prediction.ttft_at(round(prompt), ahead=sessions - 1) * 1000
    row: dict[str, Any] = {"level": level, "requests": summary["requests"], "completed": done,
                           "errors": summary["errors"], "prompt_tokens_mean": prompt and round(prompt, 1),
                           "plan_per_stream": pred["per_stream"], "plan_aggregate": pred["aggregate"]}  # fmt: skip
    for key, m, p in (("per_stream_tok_s", per_stream, each),
                      ("aggregate_tok_s", aggregate, each and each * sessions),
                      ("ttft_ms", ttft, ttft_pred)):  # fmt: skip
        r = ratio(m, p)
        row[key] = {"predicted": p and round(p, 1), "measured": m and round(m, 1), "ratio": r,
                    "within_25pct": None if r is None else abs(r - 1) <= TOLERANCE}  # fmt: skip
    row["prediction_from"] = pred["from"]
    row["sessions_predicted"] = sessions
    if "deployment_differs" in pred:
        row["deployment_differs"] = pred["deployment_differs"]
    row["itl_ms_p50"] = summary["itl_ms"]["p50"]
    return row


def run_scenario(s: dict[str, Any], args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    name, config, levels = s["name"], Path(s["config"]), [int(x) for x in s["levels"]]
    work = out_dir / "work"
    work.mkdir(parents=True, exist_ok=True)
    text = config.read_text() if config.exists() else None
    result: dict[str, Any] = {"name": name, "config": str(config), "config_text": text,
                              "levels": levels, "hold_free_mib": s.get("hold_free_mib"), "gpus": args.gpus,
                              "note": s.get("note", "")}  # fmt: skip
    held: Held | None = None
    gateway = None
    try:
        held = Held(args.python, args.hold_script, s.get("hold_free_mib"), out_dir / f"hold_{name}.log")
        result["hold"] = held.line
        started = time.monotonic()
        pred = predictions(args.python, config, args.gpus, levels, work)
        result["plan_seconds"] = round(time.monotonic() - started, 1)
        (out_dir / f"plan_{name}.json").write_text(json.dumps(pred["plan"], indent=2) + "\n")
        d = pred["decision"]
        result["deployment"] = deployment(d)
        result["rung"] = d.get("rung")
        result["prediction"] = d["prediction"]
        result["variants"] = pred["variants"]
        log(f"{name}: {d.get('rung')} {deployment(d)}; predicted {d['prediction']}")
        gateway = Gateway(args.python, config, args.gpus, args.port, out_dir / f"gateway_{name}.log")
        result["ready_seconds"] = round(gateway.wait_ready(args.ready_timeout), 1)
        result["gpu_memory_ready"] = gpu_memory()
        live = gateway.get("/v1/placement")
        with contextlib.suppress(Exception):
            live_d = next(x for x in live["decisions"] if x["model"] == d["model"])
            result["live_deployment"] = deployment(live_d)
            result["live_prediction"] = live_d.get("prediction")
        model = d["model"]
        served = Prediction.model_validate(d["prediction"])
        output_tokens = int(s.get("output_tokens", args.output_tokens))
        result["prompt_words"], result["output_tokens"] = args.prompt_tokens, output_tokens
        spec = LoadSpec(base_url=f"{gateway.root}/v1", model=model, endpoint="completions",
                        prompt_tokens=args.prompt_tokens, output_tokens=output_tokens, seed=args.seed)  # fmt: skip
        rows: list[dict[str, Any]] = []
        levels_json: list[dict[str, Any]] = []
        result["rows"], result["loadgen_levels"] = rows, levels_json  # filled level by level
        for i, level in enumerate(levels):
            n = max(int(s.get("min_requests", args.min_requests)), 2 * level)
            (res,) = asyncio.run(sweep(spec, concurrencies=[level], num_requests=n, warmup=args.warmup if i == 0 else 0,
                                       label=name, progress=True))  # fmt: skip
            summary = res.summary
            levels_json.append({"concurrency": level, "summary": summary})
            rows.append(compare(level, pred["per_level"][level], summary, served, output_tokens))
        result["gpu_memory_after"] = gpu_memory()
        result["ok"] = True
    except SystemExit:  # SIGTERM (the step's time ran out): keep what was measured, run nothing more
        result["ok"] = False
        result["stopped"] = True
        result["error"] = "stopped by SIGTERM (the step's time ran out); rows measured before are kept"
    except Exception as exc:  # a scenario that breaks is recorded, the next one still runs
        result["ok"] = False
        result["error"] = f"{type(exc).__name__}: {exc}"[-3000:]
        log(f"{name} FAILED: {result['error'][:600]}")
    finally:
        if gateway is not None:
            gateway.stop()
            result["gateway_log_tail"] = gateway.tail(40)
        if held is not None:
            held.stop()
    return result


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return NONE
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        "| scenario | plan | held to | streams | per-stream tok/s pred / meas (ratio) | aggregate tok/s pred / meas "
        "(ratio) | TTFT ms pred / meas p50 (ratio) | within ±25 % |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        dep = r.get("deployment") or {}
        plan = f"{dep.get('engine')} {dep.get('quant') or ''}".strip()
        if dep.get("engine") == "llamacpp":
            layers = dep.get("n_gpu_layers")
            plan += f", {'all' if layers is not None and layers < 0 else layers} layers, KV {dep.get('kv_cache_type')}"
        card = (r.get("prediction") or {}).get("gpu") or "the GPU"  # the plan's row for the card it saw
        held = f"{r['hold_free_mib']:,} MiB free ({card})" if r.get("hold_free_mib") else "no hold"
        if not r.get("ok"):
            error = " ".join(r.get("error", "").split())[:200]
            lines.append(f"| {r['name']} | {plan} | {held} | - | FAILED: {error} | | | |")
        for row in r.get("rows") or []:
            cells = []
            flags = []
            for key, digits in (("per_stream_tok_s", 1), ("aggregate_tok_s", 1), ("ttft_ms", 1)):
                c = row[key]
                cells.append(f"{fmt(c['predicted'], digits)} / {fmt(c['measured'], digits)} ({fmt(c['ratio'], 2)})")
                flags.append(NONE if c["within_25pct"] is None else ("yes" if c["within_25pct"] else "**no**"))
            streams = f"{row['level']}" + (f" ({row['sessions_predicted']} held)" if row["sessions_predicted"] !=
                                           row["level"] else "")  # fmt: skip
            if row["errors"]:
                streams += f", errors {row['errors']}"
            lines.append(f"| {r['name']} | {plan} | {held} | {streams} | {' | '.join(cells)} | {' / '.join(flags)} |")
    return "\n".join(lines) + "\n"


def write(results: list[dict[str, Any]], out_dir: Path, meta: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "predict_vs_measure.json").write_text(json.dumps({**meta, "scenarios": results}, indent=2) + "\n")
    head = (f"Predicted (voltgate plan) vs measured (voltgate serve + bench.loadgen), {meta.get('date', '')}. "
            "Ratio = measured / predicted; the flags are per-stream / aggregate / TTFT.\n\n")  # fmt: skip
    (out_dir / "predict_vs_measure.md").write_text(head + markdown(results))


def load_results(paths: Sequence[Path]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for path in paths:
        if path.exists():
            results += json.loads(path.read_text())["scenarios"]
    return results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.gpu.predict_vs_measure", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--scenarios", type=Path, required=True, help="YAML list of {name, config, levels, hold_free_mib}")
    r.add_argument("--only", nargs="*", default=None, help="scenario names to run (default: all)")
    r.add_argument("--gpus", default="auto")
    r.add_argument("--out-dir", type=Path, required=True)
    r.add_argument("--hold-script", type=Path, default=None, help=".gpu/hold_memory.py (no hold without it)")
    r.add_argument("--python", default=sys.executable)
    r.add_argument("--port", type=int, default=8000)
    r.add_argument("--prompt-tokens", type=int, default=128)
    r.add_argument("--output-tokens", type=int, default=256)
    r.add_argument("--min-requests", type=int, default=4)
    r.add_argument("--warmup", type=int, default=2)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--ready-timeout", type=float, default=400)
    r.add_argument("--skip-done", action="store_true", help="skip scenarios the out dir already has measured")
    r.add_argument("--commit", default=os.environ.get("VG_COMMIT"), help="git commit of the tree (no .git there)")
    rep = sub.add_parser("report")
    rep.add_argument("inputs", type=Path, nargs="+")
    rep.add_argument("--out-dir", type=Path, required=True)
    args = p.parse_args(argv)

    # `timeout` ends a step with SIGTERM: unwind through the finally blocks, which stop the gateway and the hold
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.cmd == "report":
        results = load_results(args.inputs)
        write(results, args.out_dir, {"merged_from": [str(x) for x in args.inputs], "date": time.strftime("%Y-%m-%d")})
        print(markdown(results))
        return 0

    scenarios = yaml.safe_load(args.scenarios.read_text())
    if args.only is not None:
        unknown = set(args.only) - {s["name"] for s in scenarios}
        if unknown:
            raise SystemExit(f"unknown scenarios: {sorted(unknown)}")
        scenarios = [s for s in scenarios if s["name"] in args.only]
    out = args.out_dir / "predict_vs_measure.json"
    results = load_results([out])
    meta = {"date": time.strftime("%Y-%m-%d"), "commit": args.commit, "command": sys.orig_argv,
            "prompt_words": args.prompt_tokens, "output_tokens": args.output_tokens,
            "gpus": args.gpus, "nvidia_smi": gpu_name()}  # fmt: skip
    done = {x["name"] for x in results if x.get("ok")}
    for s in scenarios:
        if args.skip_done and s["name"] in done:
            log(f"scenario {s['name']}: already measured, skipped")
            continue
        log(f"scenario {s['name']}")
        results = [x for x in results if x["name"] != s["name"]] + [run_scenario(s, args, args.out_dir)]
        write(results, args.out_dir, meta)
        if results[-1].get("stopped"):
            break
    print(markdown(results))
    return 0 if all(x.get("ok") for x in results) else 1


def gpu_name() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


if __name__ == "__main__":
    raise SystemExit(main())
