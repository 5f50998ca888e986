"""`make bench`: the CPU suite on the embedded SmolLM2 model, a few minutes on 2 cores.

Writes `bench/results/<YYYY-MM-DD>-cpu/`: batching.json, overhead.json, suite.json, two PNGs and summary.md
(tables, exact commands, hardware). Process logs go to `bench/out/<date>-cpu-logs/` (not committed).

    python -m bench.cpu_suite [--out DIR] [--quick] [--only batching overhead]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import batching, launch, live_speed, overhead, plots, provenance, report

REPO = Path(__file__).resolve().parent.parent
STAGES = ("batching", "overhead", "live_speed")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cpu_suite", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="result directory (default bench/results/<date>-cpu)")
    p.add_argument("--model-path", type=Path, help="GGUF (default: the embedded SmolLM2-135M Q4_1)")
    p.add_argument("--only", nargs="+", choices=STAGES, default=list(STAGES))
    p.add_argument("--quick", action="store_true", help="fewer requests: a smoke run, not a measurement")
    args = p.parse_args(argv)

    date = dt.date.today().isoformat()
    out = args.out or REPO / "bench" / "results" / f"{date}-cpu"
    log_dir = REPO / "bench" / "out" / f"{date}-cpu-logs"
    out.mkdir(parents=True, exist_ok=True)
    model_path = args.model_path or launch.default_model_path()
    meta = provenance.collect(model_shape=provenance.gguf_shape(model_path))
    model_arg = f" --model-path {shlex.quote(str(args.model_path))}" if args.model_path else ""
    quick = " --quick" if args.quick else ""
    batching_kw: dict[str, Any] = {
        "concurrencies": (1, 4, 8, 16),
        "many_slots": 16,
        # One thread: the other core is left to the load generator and the gateway. On a shared 2-core VM
        # llama.cpp with 2 threads stalls whenever anything else runs (its threads spin at barriers).
        "n_threads": 1,
        "prompt_tokens": 64,
        "output_tokens": 32 if args.quick else 64,
        "requests_per_level": 8 if args.quick else None,
        "requests_per_stream": 1,
    }
    suite: dict[str, Any] = {
        "kind": "cpu_suite",
        "date": date,
        "meta": meta,
        "quick": args.quick,
        "part_commands": [
            "# the parts alone:",
            f".venv/bin/python -m bench.batching --concurrency 1 4 8 16 --slots 16 --n-threads 1 --prompt-tokens 64 "
            f"--output-tokens {batching_kw['output_tokens']} --requests-per-stream 1"
            + (f" --num-requests {batching_kw['requests_per_level']}" if args.quick else "")
            + f"{model_arg} --output batching.json",
            f".venv/bin/python -m bench.overhead{quick}{model_arg} --output overhead.json",
            f".venv/bin/python -m bench.live_speed --n-threads 1{model_arg} --output live_speed.json",
        ],
        "stage_s": {},
        "errors": {},
    }
    started = time.monotonic()
    for stage in STAGES:
        if stage not in args.only:
            continue
        print(f"== {stage}", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            if stage == "batching":
                result = batching.run(model_path, log_dir, **batching_kw)
                note = f"{meta['hardware']['cpu_model']}, {meta['hardware']['cpu_count']} cores; SmolLM2-135M Q4_1"
                plots.plot_sweeps(result["series"], out, note=note)
            elif stage == "overhead":
                result = overhead.run(model_path, log_dir, quick=args.quick)
            else:
                result = live_speed.run(model_path, log_dir, n_threads=1)
            suite[stage] = result
            _write_json(out / f"{stage}.json", {"meta": meta, **result})
        except Exception as exc:  # one failed stage must not lose the others' results
            traceback.print_exc()
            suite["errors"][stage] = f"{type(exc).__name__}: {str(exc)[:500]}"
        suite["stage_s"][stage] = time.monotonic() - t0
    suite["wall_s"] = time.monotonic() - started
    _write_json(out / "suite.json", {k: v for k, v in suite.items() if k not in STAGES})
    (out / "summary.md").write_text(report.suite_summary(suite))
    print(f"wrote {out}/summary.md in {suite['wall_s']:.0f} s", file=sys.stderr)
    return 1 if suite["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
