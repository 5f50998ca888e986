"""Measured speed on live traffic, per model, beside the plan's prediction: decode tokens/s per stream, time to
first token, and how many streams the model's worker had in flight at the time.

Fed by request accounting (`gateway.serving.session.RequestScope`): `begin()` when a chat or completion request takes
its admission slot, `end()` when it finishes. The window is each model's last WINDOW_REQUESTS completed
requests (status 200, usage known; refused, failed and abandoned ones are not samples), whatever their age:
`window_age_s` says how old its oldest is. Per request:

- decode tokens/s per stream, for streamed requests with at least 2 generated tokens per stream: (tokens per
  stream - 1) / (last chunk - first chunk with generated content), as `bench.stats` measures a client's. A
  unary request's body arrives whole, so the gateway has no first-token time for it: it counts in the window,
  its prompt tokens and concurrency, and gives `unary_tok_s` (tokens per stream / time at the worker, prefill
  included: a lower bound on its decode speed), never a decode or TTFT sample.
- TTFT: admission slot taken → first chunk with generated content (a role-only chunk is not a token). Waiting
  for a slot or for the model's load is left out, as the prediction leaves it out.
- concurrent streams: the time-weighted mean of the streams the model had in flight over the request's time at
  the worker, itself included (`n` choices count n); "alone" when no other stream was in flight at any moment.

Ratios to the plan's `Prediction` (measured / predicted; null without a prediction or without samples):
- `decode_single`: p50 over requests that ran alone of decode speed / `Prediction.per_stream_at(1, length)`;
- `decode_per_stream`: p50 over requests of decode speed / `Prediction.per_stream_at(concurrency, length)` at
  that request's own concurrency; `length` is the request's mean session length while it decoded (prompt
  tokens + half its generated tokens per stream), so the ratio sets the request against the plan's formula for
  that very request, not against the plan's full-context promise;
- `ttft`: p50 over requests that ran alone of TTFT / `Prediction.ttft_at(prompt tokens)` (the request overhead
  plus that prompt's prefill, by the plan's own inputs), less the tokens its engine served from its prefix
  cache (`prompt_tokens_details.cached_tokens`, when the engine reports it).

Concurrency: every method runs on the gateway's one event loop and none awaits, so no lock is needed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.placement.performance import Prediction

WINDOW_REQUESTS = 200
"""Completed requests kept per model (bounded memory: a few hundred small records per configured model)."""
MIN_PREFILL_TOKENS = 64
"""A request measures the prefill speed when it prefilled at least this many tokens (shorter: TTFT is overhead)."""


@dataclass(eq=False)
class Flight:
    """One request at the worker, from its admission slot to its end (compared by identity)."""

    model: str
    streams: int
    started: float
    area_at_start: float  # the model's streams x seconds integral when it began
    alone: bool = True


@dataclass(frozen=True, slots=True)
class Sample:
    """What one completed request measured (module docstring); None where it could not be measured."""

    prompt_tokens: int
    concurrency: float
    alone: bool
    finished_at: float
    streamed: bool = False
    cached_tokens: int = 0  # of the prompt, served from the engine's prefix cache
    generated_tokens: float = 0.0  # per stream
    ttft_s: float | None = None
    decode_tok_s: float | None = None
    unary_tok_s: float | None = None


@dataclass
class _ModelState:
    samples: deque[Sample]
    flights: set[Flight] = field(default_factory=set)
    streams: int = 0
    area: float = 0.0  # integral over time of the streams in flight
    changed_at: float = 0.0

    def advance(self, now: float) -> None:
        self.area += self.streams * max(0.0, now - self.changed_at)
        self.changed_at = now


class LiveSpeed:
    """Each model's window of measured requests, and the plan's predictions to set them against."""

    def __init__(self, *, window: int = WINDOW_REQUESTS, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.predictions: dict[str, Prediction] = {}
        self._clock = clock
        self._models: dict[str, _ModelState] = {}

    def _state(self, model: str) -> _ModelState:
        state = self._models.get(model)
        if state is None:
            state = self._models[model] = _ModelState(deque(maxlen=self.window))
        return state

    def begin(self, model: str, streams: int = 1) -> Flight:
        """A request of `streams` streams reached the worker (took its admission slot)."""
        state, now = self._state(model), self._clock()
        state.advance(now)
        flight = Flight(model, streams, now, state.area, alone=streams == 1 and not state.flights)
        for other in state.flights:
            other.alone = False
        state.flights.add(flight)
        state.streams += streams
        return flight

    def end(
        self,
        flight: Flight,
        *,
        completed: bool,
        tokens: tuple[int, int] | None,
        first_content_at: float | None = None,
        last_chunk_at: float | None = None,
        streamed: bool = False,
        cached_tokens: int = 0,
    ) -> Sample | None:
        """The request ended; a completed one with usage (`tokens`: prompt, generated; `cached_tokens` of the
        prompt from the prefix cache) becomes a sample. The times are the relay's (`gateway.serving.relay.StreamStats`),
        on this object's clock. A second call does nothing."""
        state = self._state(flight.model)
        if flight not in state.flights:
            return None
        now = self._clock()
        state.advance(now)
        state.flights.discard(flight)
        state.streams -= flight.streams
        if not completed or tokens is None:
            return None
        span = now - flight.started
        concurrency = (state.area - flight.area_at_start) / span if span > 0 else float(flight.streams)
        per_stream = tokens[1] / flight.streams
        cached = min(cached_tokens, tokens[0])
        sample = Sample(tokens[0], concurrency, flight.alone, finished_at=now, streamed=streamed, cached_tokens=cached,
                        generated_tokens=per_stream)  # fmt: skip
        if first_content_at is not None:
            sample = _timed(sample, first_content_at - flight.started, per_stream, first_content_at, last_chunk_at)
        elif not streamed and span > 0 and per_stream > 0:
            sample = dataclasses.replace(sample, unary_tok_s=per_stream / span)
        state.samples.append(sample)
        return sample

    def samples(self, model: str) -> list[Sample]:
        state = self._models.get(model)
        return list(state.samples) if state is not None else []

    def prefill_seconds(self, model: str, tokens: int) -> float | None:
        """Seconds this model takes to prefill `tokens` prompt tokens: at its measured prefill speed (p50, over
        the window's streamed requests that ran alone and prefilled at least MIN_PREFILL_TOKENS, of prefilled
        tokens / TTFT: a lower bound on the speed, TTFT holding the request overhead too), else by the plan's
        prediction (`Prediction.ttft_at` less its overhead); None without either."""
        rates = [
            (s.prompt_tokens - s.cached_tokens) / s.ttft_s
            for s in self.samples(model)
            if s.ttft_s and s.alone and s.prompt_tokens - s.cached_tokens >= MIN_PREFILL_TOKENS
        ]
        rate = percentile(rates, 50)
        if rate:
            return tokens / rate
        prediction = self.predictions.get(model)
        if prediction is None or tokens <= 0:
            return None
        return max(0.0, prediction.ttft_at(tokens) - prediction.inputs.request_overhead_s)

    def summary(self, model: str) -> dict[str, Any]:
        """The model's `measured` object for `/v1/placement` (JSON-safe: null where there is no data)."""
        return summarize(self.samples(model), self.predictions.get(model), now=self._clock(), window=self.window)

    def medians(self) -> dict[str, tuple[float | None, float | None]]:
        """Per model with samples: p50 decode tokens/s per stream and p50 TTFT seconds (for `/metrics`)."""
        out = {}
        for model, state in self._models.items():
            if state.samples:
                decode = [s.decode_tok_s for s in state.samples if s.decode_tok_s is not None]
                ttft = [s.ttft_s for s in state.samples if s.ttft_s is not None]
                out[model] = (percentile(decode, 50), percentile(ttft, 50))
        return out


def _timed(sample: Sample, ttft_s: float, per_stream: float, first: float, last: float | None) -> Sample:
    """A streamed sample's TTFT and, with two tokens or more per stream over a measurable time, its decode speed."""
    decode = None
    if last is not None and last > first and per_stream >= 2:
        decode = (per_stream - 1) / (last - first)
    return dataclasses.replace(sample, ttft_s=max(0.0, ttft_s), decode_tok_s=decode)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), interpolated linearly between order statistics (as `bench.stats`)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(rank), math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


def _distribution(values: Sequence[float], digits: int, *stats: str) -> dict[str, float | int | None] | None:
    """{"n", and each of "p50", "p90", "mean" asked for}, or None for no values."""
    if not values:
        return None
    out: dict[str, float | int | None] = {"n": len(values)}
    for stat in stats:
        value = sum(values) / len(values) if stat == "mean" else percentile(values, float(stat[1:]))
        out[stat] = _round(value, digits)
    return out


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(samples: Sequence[Sample], prediction: Prediction | None, *, now: float, window: int) -> dict[str, Any]:
    """The `measured` object of one model's window (module docstring says what each field is)."""
    decode = [s.decode_tok_s for s in samples if s.decode_tok_s is not None]
    single = [s.decode_tok_s for s in samples if s.decode_tok_s is not None and s.alone]
    return {
        "window_requests": len(samples),
        "window_limit": window,
        "window_age_s": _round(now - samples[0].finished_at, 1) if samples else None,
        "streamed_requests": sum(1 for s in samples if s.streamed),
        "decode_tok_s_per_stream": _distribution(decode, 1, "p50", "mean"),
        "decode_tok_s_single_stream": _distribution(single, 1, "p50", "mean"),
        "unary_tok_s": _distribution([s.unary_tok_s for s in samples if s.unary_tok_s is not None], 1, "p50", "mean"),
        "ttft_s": _distribution([s.ttft_s for s in samples if s.ttft_s is not None], 4, "p50", "p90"),
        "mean_prompt_tokens": _round(_mean([s.prompt_tokens for s in samples]), 1),
        "mean_cached_prompt_tokens": _round(_mean([s.cached_tokens for s in samples]), 1),
        "mean_concurrent_streams": _round(_mean([s.concurrency for s in samples]), 2),
        "ratio_to_predicted": ratios(samples, prediction) if prediction is not None else None,
    }


def ratios(samples: Sequence[Sample], prediction: Prediction) -> dict[str, float | None]:
    """Measured / predicted: decode alone, decode at each request's concurrency, TTFT alone (module docstring)."""
    single, per_stream, ttft = [], [], []
    for s in samples:
        if s.decode_tok_s is not None:
            length = s.prompt_tokens + int(s.generated_tokens // 2)
            per_stream.append(s.decode_tok_s / prediction.per_stream_at(s.concurrency, length))
            if s.alone:
                single.append(s.decode_tok_s / prediction.per_stream_at(1, length))
        prefilled = s.prompt_tokens - s.cached_tokens
        if s.ttft_s is not None and s.alone and (seconds := predicted_ttft(prediction, prefilled)) is not None:
            ttft.append(s.ttft_s / seconds)
    return {
        "decode_single": _round(percentile(single, 50), 3),
        "decode_per_stream": _round(percentile(per_stream, 50), 3),
        "ttft": _round(percentile(ttft, 50), 3),
    }


def predicted_ttft(prediction: Prediction, prompt_tokens: int) -> float | None:
    """The plan's TTFT for a prompt of `prompt_tokens` on an idle deployment (`Prediction.ttft_at`)."""
    return prediction.ttft_at(prompt_tokens) if prompt_tokens > 0 else None


def predictions_from_placement(placement: Mapping[str, Any], models: Collection[str]) -> dict[str, Prediction]:
    """The prediction of each of `models` in a placement report's JSON (as `/v1/placement` serves it)."""
    out = {}
    for decision in placement.get("decisions") or ():
        if isinstance(decision, dict) and decision.get("model") in models and decision.get("prediction"):
            with contextlib.suppress(ValueError):  # pydantic's ValidationError is one
                out[str(decision["model"])] = Prediction.model_validate(decision["prediction"])
    return out


def placement_with_measured(placement: Mapping[str, Any], live: LiveSpeed, served: Collection[str]) -> dict[str, Any]:
    """The placement report with a `measured` object beside each decision's `prediction` (null for a model
    that is not served); the report itself is not changed."""
    decisions = [
        {**d, "measured": live.summary(d["model"]) if d.get("model") in served else None}
        for d in placement.get("decisions") or ()
        if isinstance(d, dict)
    ]
    return {**placement, "decisions": decisions} if "decisions" in placement else dict(placement)
