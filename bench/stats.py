"""Per-request records of a load run and the statistics summarised from them (percentiles, rates)."""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    """What one streamed request did. Times are seconds; `start_s` is relative to the level's start."""

    index: int
    start_s: float = 0.0
    ok: bool = False
    status: int | None = None
    error: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int = 0
    chunks: int = 0
    content_chunks: int = 0

    @property
    def decode_tok_s(self) -> float | None:
        """This stream's decode speed: tokens after the first over the time after the first token."""
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        decode_s = self.e2e_s - self.ttft_s
        return (self.output_tokens - 1) / decode_s if decode_s > 0 else None

    def to_json(self, *, with_itl: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not with_itl:
            data.pop("itl_s")
        return data


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's default)."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile out of range: {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    lo = math.floor(rank)
    hi = math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def distribution(values: Iterable[float], *, scale: float = 1.0) -> dict[str, float | None]:
    """mean and p50/p90/p99 of `values`, each multiplied by `scale` (1000 turns seconds into ms)."""
    vals = [v * scale for v in values]
    out: dict[str, float | None] = {"mean": sum(vals) / len(vals) if vals else None}
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(vals, q)
    return out


def summarize(records: Sequence[RequestRecord], duration_s: float) -> dict[str, Any]:
    """The level summary: counts, rates over `duration_s`, and latency distributions in milliseconds.

    Rates count only successful requests; errors are tallied by kind (`http_503`, `stream_error`, ...).
    """
    done = [r for r in records if r.ok]
    errors = Counter(r.error or "unknown" for r in records if not r.ok)
    output_tokens = sum(r.output_tokens for r in done)
    chunks = sum(r.chunks for r in done)
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda _n: None)
    tpot = [
        (r.e2e_s - r.ttft_s) / (r.output_tokens - 1)
        for r in done
        if r.e2e_s is not None and r.ttft_s is not None and r.output_tokens > 1
    ]
    return {
        "requests": len(records),
        "completed": len(done),
        "errors": dict(sorted(errors.items())),
        "duration_s": duration_s,
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in done),
        "output_tokens": output_tokens,
        "chunks": chunks,
        "request_throughput": per_s(len(done)),
        "output_throughput": per_s(output_tokens),
        "chunk_throughput": per_s(chunks),
        "ttft_ms": distribution((r.ttft_s for r in done if r.ttft_s is not None), scale=1000),
        "itl_ms": distribution((x for r in done for x in r.itl_s), scale=1000),
        "tpot_ms": distribution(tpot, scale=1000),
        "e2e_ms": distribution((r.e2e_s for r in done if r.e2e_s is not None), scale=1000),
        "decode_tok_s_per_stream": distribution(d for r in done if (d := r.decode_tok_s) is not None),
    }


def median(values: Iterable[float]) -> float | None:
    return percentile(list(values), 50)


def bootstrap_median_ci(
    values: Sequence[float], *, level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """A percentile-bootstrap confidence interval for the median (deterministic for a given seed)."""
    if len(values) < 2:
        return None
    rng = random.Random(seed)
    n = len(values)
    medians = sorted(median(rng.choices(values, k=n)) or 0.0 for _ in range(resamples))
    tail = (1 - level) / 2 * 100
    lo, hi = percentile(medians, tail), percentile(medians, 100 - tail)
    assert lo is not None and hi is not None
    return lo, hi


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is zero."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator
