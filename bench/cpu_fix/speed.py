"""CPU prefill and decode speed of the AMX-crash fixes, side by side, each probe in its own process.

For each llama.cpp build (a folder holding libllama.so, selected with LLAMA_CPP_LIB_PATH), each
`use_extra_bufts` setting and each GGUF, runs `backends.llamacpp.selftest` in a child process (a crash is
recorded as the signal, not lost), REPEATS times, and writes one JSON line per probe plus a median table.

    python -m bench.cpu_fix.speed --out DIR --lib native=/tmp/lib-native --lib noamx=/tmp/lib-noamx \\
        --model q4_1=M.gguf --threads 4 --threads 16 --prompt-tokens 256 --gen-tokens 64 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def _pairs(values: list[str]) -> list[tuple[str, str]]:
    return [tuple(v.split("=", 1)) for v in values]  # type: ignore[misc]


def _probe(lib: str, model: str, setting: str, threads: int, args: argparse.Namespace) -> dict[str, object]:
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=lib)
    env.pop("VOLTGATE_LLAMA_EXTRA_BUFTS", None)
    cmd = [sys.executable, "-m", "backends.llamacpp.selftest", "--probe", "--json", "--model", model]
    cmd += ["--extra-bufts", setting, "--threads", str(threads)]
    cmd += ["--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    if done.returncode != 0:
        return {"ok": False, "returncode": done.returncode, "stderr": done.stderr[-600:]}
    out: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    out["ok"] = True
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--lib", action="append", required=True, help="NAME=DIR with libllama.so")
    ap.add_argument("--model", action="append", required=True, help="NAME=PATH.gguf")
    ap.add_argument("--settings", default="on,off", help="use_extra_bufts settings to try")
    ap.add_argument("--threads", type=int, action="append", required=True)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with (args.out / "probes.jsonl").open("w") as raw:
        for lib_name, lib in _pairs(args.lib):
            for model_name, model in _pairs(args.model):
                for setting in args.settings.split(","):
                    for threads in args.threads:
                        runs = [_probe(lib, model, setting, threads, args) for _ in range(args.repeats)]
                        for r in runs:
                            r.update(build=lib_name, model=model_name, setting=setting, threads=threads)
                            r.pop("system_info", None) if r is not runs[0] else None
                            raw.write(json.dumps(r) + "\n")
                        rows.append(_summary(lib_name, model_name, setting, threads, runs))
                        print(json.dumps(rows[-1]), flush=True)
    (args.out / "summary.json").write_text(json.dumps(rows, indent=1))
    (args.out / "summary.md").write_text(_table(rows))


def _summary(build: str, model: str, setting: str, threads: int, runs: list[dict[str, object]]) -> dict[str, object]:
    good = [r for r in runs if r["ok"]]
    crashes = [r["returncode"] for r in runs if not r["ok"]]
    return {
        "build": build,
        "model": model,
        "extra_bufts": setting,
        "threads": threads,
        "runs": len(runs),
        "crashed": crashes,
        "prefill_tok_s": statistics.median(float(r["prefill_tok_s"]) for r in good) if good else None,  # type: ignore[arg-type]
        "decode_tok_s": statistics.median(float(r["decode_tok_s"]) for r in good) if good else None,  # type: ignore[arg-type]
    }


def _table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| build | model | extra bufts | threads | prefill tok/s | decode tok/s | crashed (exit codes) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        pre = f"{r['prefill_tok_s']:.0f}" if r["prefill_tok_s"] else "-"
        dec = f"{r['decode_tok_s']:.1f}" if r["decode_tok_s"] else "-"
        lines.append(
            f"| {r['build']} | {r['model']} | {r['extra_bufts']} | {r['threads']} | {pre} | {dec} | "
            f"{r['crashed'] or ''} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
