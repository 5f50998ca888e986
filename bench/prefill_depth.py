"""The engine's own price of a cached prefix: N new tokens prefilled after D cached ones vs from position 0.

Issue 41 holds a cached agent turn's TTFT to 1.5x a one-turn prompt of the turn's new tokens. A cached turn's
new tokens attend over every cached position (7-9k in the recorded sessions), which a one-turn prompt of the
same tokens does not, so part of the gap is the engine's, and no server around it can take it away. This
measures that part with nothing around the engine: the worker's own native layer (`Model`, `Batch`: the
llama.cpp build and context settings the worker runs, KV type, flash attention, one sequence of `--ctx`
tokens), no HTTP, no template, no sampling. For each depth D and count N: fill the sequence to D once, then
`--repeats` times decode N tokens at positions D..D+N (in `--n-batch` chunks, logits for the last, waited
for) and cut the sequence back to D; the median wall time, and its ratio to the same N at depth 0.

    python -m bench.prefill_depth --out DIR                       # the embedded SmolLM2 on this CPU
    python -m bench.prefill_depth --model /tmp/gpu/gguf/7b-q4_k_m.gguf --gpu --kv q8_0 --out DIR   # `depth:gguf`
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bench import provenance
from bench.launch import default_model_path

if TYPE_CHECKING:
    from backends.llamacpp.worker.native import Batch, Model


@dataclass(frozen=True)
class Timing:
    depth: int  # cached positions before the new tokens
    tokens: int  # new tokens prefilled
    ms: list[float]  # one per repeat


@dataclass(frozen=True)
class Row:
    tokens: int
    depth: int
    median_ms: float
    vs_depth0: float | None  # median over the same `tokens` at depth 0 (None without a depth-0 timing)


def rows(timings: Sequence[Timing]) -> list[Row]:
    """Each timing's median and its ratio to the same token count at depth 0, by tokens then depth."""
    medians = {(t.tokens, t.depth): statistics.median(t.ms) for t in timings}
    out = []
    for (tokens, depth), median in sorted(medians.items()):
        base = medians.get((tokens, 0))
        out.append(Row(tokens, depth, round(median, 2), round(median / base, 3) if base else None))
    return out


def markdown(table: Sequence[Row], title: str) -> str:
    lines = [f"# {title}", "", "| new tokens | cached depth | median ms | / depth 0 |", "|---|---|---|---|"]
    for r in table:
        ratio = "-" if r.vs_depth0 is None else f"{r.vs_depth0:.3f}"
        lines.append(f"| {r.tokens} | {r.depth:,} | {r.median_ms:.2f} | {ratio} |")
    return "\n".join(lines) + "\n"


def _prefill(model: Model, batch: Batch, tokens: Sequence[int], start: int) -> None:
    """Decode `tokens` at positions start.. in chunks of the batch's capacity; wait for the last logits."""
    for i in range(0, len(tokens), batch.capacity):
        chunk = tokens[i : i + batch.capacity]
        batch.clear()
        batch.add_run(chunk, start + i, 0, logits=i + len(chunk) == len(tokens))
        model.decode(batch)
    float(model.logits(1)[0, 0])  # reading a logit waits for the device


def measure(model: Model, batch: Batch, depth: int, counts: Sequence[int], repeats: int, seed: int) -> list[Timing]:
    """Fill sequence 0 to `depth` (untimed), then time each count `repeats` times, cut back to `depth` after each."""
    rng = random.Random(seed)

    def pick(n: int) -> list[int]:  # token ids away from the vocabulary's ends (its special tokens)
        return [rng.randrange(100, model.n_vocab - 100) for _ in range(n)]

    model.seq_clear(0)
    if depth:
        _prefill(model, batch, pick(depth), 0)
    timings = []
    for n in counts:
        new = pick(n)
        _prefill(model, batch, new, depth)  # a warm-up: the first decode of a shape pays for its graph
        model.seq_remove(0, depth)
        ms = []
        for _ in range(repeats):
            start = time.perf_counter()
            _prefill(model, batch, new, depth)
            ms.append((time.perf_counter() - start) * 1000)
            model.seq_remove(0, depth)
        timings.append(Timing(depth, n, ms))
    return timings


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.prefill_depth", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", type=Path, default=None, help="a GGUF (default: the embedded SmolLM2)")
    p.add_argument("--gpu", action="store_true", help="every layer on the GPU")
    p.add_argument("--kv", default="f16", help="KV cache type (the worker's --cache-type names)")
    p.add_argument("--ctx", type=int, default=10240, help="the sequence's context (a slot's)")
    p.add_argument("--n-batch", type=int, default=512)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--depths", type=int, nargs="+", default=[0, 4096, 8192])
    p.add_argument("--counts", type=int, nargs="+", default=[64, 150, 300, 512])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    from backends.llamacpp.worker.native import Batch, ContextOptions, Model  # loads llama.cpp

    path = args.model or default_model_path()
    options = ContextOptions(n_ctx_per_seq=args.ctx, n_seq_max=1, n_batch=args.n_batch, n_threads=args.threads,
                             n_gpu_layers=-1 if args.gpu else 0, cache_type=args.kv)  # fmt: skip
    model = Model(path, options)
    batch = Batch(args.n_batch)
    timings = [t for d in args.depths for t in measure(model, batch, d, args.counts, args.repeats, seed=d)]
    table = rows(timings)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = provenance.collect(model=str(path), model_shape=provenance.gguf_shape(path), gpu=args.gpu, kv=args.kv,
                              ctx=args.ctx, n_batch=args.n_batch)  # fmt: skip
    doc = {"meta": meta, "timings": [asdict(t) for t in timings], "rows": [asdict(r) for r in table]}
    (args.out / "prefill-depth.json").write_text(json.dumps(doc, indent=1) + "\n")
    title = f"Prefill after a cached prefix: {path.name}, KV {args.kv}, {'GPU' if args.gpu else 'CPU'}"
    (args.out / "prefill-depth.md").write_text(markdown(table, title))
    print(markdown(table, title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
