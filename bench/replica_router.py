"""The replica router's own cost per request (issue 38: "the router's added cost on the CPU, with and without
prefix affinity"): `ReplicaRouter.pick` timed in-process on agent-shaped prompts, so the number is the router's
and nothing else's (the HTTP relay around it is `bench.relay_seam`'s).

    python -m bench.replica_router [--replicas 2 4 8] [--chars 20000 120000] [--picks 2000]

Each case routes `picks` requests over `replicas` replicas: `affinity` sends prompts that share one long
prefix (an agent's tools and history) with a new tail, round-robin over 16 sessions, as agent traffic does;
`unique` sends prompts that share nothing (no prefix match to find). Prints one JSON line per case: the median
and p99 microseconds per pick, and how the picks were decided.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import Counter

from gateway.serving.replica_router import ReplicaLoad, ReplicaRouter


def _case(replicas: int, chars: int, picks: int, affinity: bool) -> dict[str, object]:
    rng = random.Random(0)
    router = ReplicaRouter()
    prefix = "".join(rng.choice("abcdefghij klmnop") for _ in range(chars))
    outstanding = [0] * replicas
    timings, reasons = [], Counter[str]()
    for i in range(picks):
        tail = f" turn {i}: {rng.random()}"
        prompt = prefix + tail if affinity else f"{rng.random()} " + prefix[: chars // 4] + tail
        loads = [ReplicaLoad(f"r{k}", outstanding[k]) for k in range(replicas)]
        started = time.perf_counter()
        chosen = router.pick(loads, prompt, session=f"s{i % 16}" if affinity else None)
        timings.append((time.perf_counter() - started) * 1e6)
        reasons[chosen.reason] += 1
        outstanding[int(chosen.replica[1:])] += 1
        if i % 3 == 0:  # requests finish: the load stays a few requests deep
            busiest = max(range(replicas), key=lambda k: outstanding[k])
            outstanding[busiest] = max(0, outstanding[busiest] - 2)
    timings.sort()
    return {"replicas": replicas, "prompt_chars": chars, "traffic": "affinity" if affinity else "unique",
            "picks": picks, "p50_us": round(statistics.median(timings), 1),
            "p99_us": round(timings[int(0.99 * len(timings))], 1), "reasons": dict(reasons)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--chars", type=int, nargs="+", default=[20_000, 120_000])  # ~5k and ~30k tokens
    parser.add_argument("--picks", type=int, default=2000)
    args = parser.parse_args()
    for replicas in args.replicas:
        for chars in args.chars:
            for affinity in (True, False):
                print(json.dumps(_case(replicas, chars, args.picks, affinity)), flush=True)


if __name__ == "__main__":
    main()
