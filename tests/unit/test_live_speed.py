"""The live speed window: known timings in, known decode speeds, TTFTs, concurrencies and ratios out; an empty
window is nulls (never NaN); the window stays bounded; the measured and predicted gauges reach /metrics."""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.ops.live_speed import (
    LiveSpeed,
    Sample,
    placement_with_measured,
    predicted_ttft,
    predictions_from_placement,
    summarize,
)
from gateway.ops.metrics import Metrics
from gateway.placement.performance import (
    COPY_EFFICIENCY,
    CPU_PREFILL_FLOPS_PER_THREAD,
    GPUSpec,
    Prediction,
    PredictionInputs,
    StepCost,
    Workload,
)

# One stream 100 tok/s (10 ms a step, 5 ms more per further stream: 4 streams 40 tok/s each, 8 streams 22.2);
# prefill 1,000 tok/s after a 10 ms step, no request overhead (one CPU thread: context does not change a step).
STEPS = Workload(
    "llamacpp", StepCost(0.01, 0.005, 0.005), 1, host_params=CPU_PREFILL_FLOPS_PER_THREAD / 2e3, host_threads=1
)
PREDICTION = Prediction(
    gpu="CPU, 1 thread", context_tokens=4096, decode_tok_s_1=100.0, sessions=4, decode_tok_s_per_stream=40.0,
    aggregate_tok_s=160.0, capacity_sessions=8, capacity_tok_s=177.8, prefill_tok_s=961.5, ttft_s=0.522,
    ttft_burst_s=2.088, inputs=PredictionInputs(gpu=None, workload=STEPS, request_overhead_s=0.0),
)  # fmt: skip


class FakeClock:
    """Stands for `time.monotonic`: the test sets the time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def live_at(window: int = 200) -> tuple[LiveSpeed, FakeClock]:
    clock = FakeClock()
    return LiveSpeed(window=window, clock=clock), clock


def streamed(
    live: LiveSpeed, clock: FakeClock, *, start: float, first: float, last: float, tokens: tuple[int, int]
) -> Sample | None:
    """One streamed request of model "m" at the worker from `start`, its first content at `first`, ending at
    `last` (its last chunk)."""
    clock.now = start
    flight = live.begin("m")
    clock.now = last
    return live.end(flight, completed=True, tokens=tokens, first_content_at=first, last_chunk_at=last, streamed=True)


def test_a_streams_decode_speed_is_tokens_after_the_first_over_first_to_last_content() -> None:
    live, clock = live_at()
    sample = streamed(live, clock, start=1.0, first=1.5, last=3.5, tokens=(20, 41))
    assert sample is not None
    assert sample.decode_tok_s == pytest.approx(40 / 2.0)  # 40 tokens after the first in 2 s
    assert sample.ttft_s == pytest.approx(0.5)  # admission to the first generated token
    assert (sample.alone, sample.concurrency, sample.unary_tok_s) == (True, 1.0, None)
    summary = live.summary("m")
    assert summary["window_requests"] == 1 and summary["streamed_requests"] == 1
    assert summary["decode_tok_s_per_stream"] == {"n": 1, "p50": 20.0, "mean": 20.0}
    assert summary["decode_tok_s_single_stream"] == {"n": 1, "p50": 20.0, "mean": 20.0}
    assert summary["ttft_s"] == {"n": 1, "p50": 0.5, "p90": 0.5}
    assert summary["mean_prompt_tokens"] == 20.0


def test_one_generated_token_or_no_time_between_gives_a_ttft_but_no_decode_speed() -> None:
    live, clock = live_at()
    one = streamed(live, clock, start=0.0, first=0.2, last=0.2, tokens=(5, 1))
    same_read = streamed(live, clock, start=1.0, first=1.2, last=1.2, tokens=(5, 6))  # every chunk in one read
    assert one is not None and same_read is not None
    assert (one.decode_tok_s, one.ttft_s) == (None, pytest.approx(0.2))
    assert (same_read.decode_tok_s, same_read.ttft_s) == (None, pytest.approx(0.2))
    assert live.summary("m")["decode_tok_s_per_stream"] is None


def test_a_unary_request_counts_but_gives_only_a_lower_bound_on_decode() -> None:
    live, clock = live_at()
    flight = live.begin("m")
    clock.now = 1.5
    sample = live.end(flight, completed=True, tokens=(10, 30))
    assert sample is not None
    assert (sample.decode_tok_s, sample.ttft_s) == (None, None)  # no first-token time at the gateway
    assert sample.unary_tok_s == pytest.approx(20.0)  # 30 tokens in 1.5 s at the worker, prefill included
    summary = live.summary("m")
    assert (summary["window_requests"], summary["streamed_requests"]) == (1, 0)
    assert summary["unary_tok_s"] == {"n": 1, "p50": 20.0, "mean": 20.0}
    assert summary["ttft_s"] is None and summary["decode_tok_s_per_stream"] is None


def test_concurrency_is_the_time_weighted_streams_in_flight_and_overlap_is_not_alone() -> None:
    live, clock = live_at()
    a = live.begin("m")  # t = 0
    clock.now = 1.0
    b = live.begin("m")
    clock.now = 2.0
    sample_b = live.end(b, completed=True, tokens=(1, 1))
    clock.now = 4.0
    sample_a = live.end(a, completed=True, tokens=(1, 1))
    clock.now = 5.0
    c = live.begin("m")
    other = live.begin("other")  # another model's streams are not this one's
    clock.now = 6.0
    sample_c = live.end(c, completed=True, tokens=(1, 1))
    live.end(other, completed=True, tokens=(1, 1))
    assert sample_a is not None and sample_b is not None and sample_c is not None
    assert sample_a.concurrency == pytest.approx((1 * 1 + 2 * 1 + 1 * 2) / 4)  # 1 stream, then 2, then 1 again
    assert sample_b.concurrency == pytest.approx(2.0)
    assert (sample_a.alone, sample_b.alone, sample_c.alone) == (False, False, True)
    assert sample_c.concurrency == pytest.approx(1.0)
    assert live.summary("m")["mean_concurrent_streams"] == pytest.approx((1.25 + 2.0 + 1.0) / 3, abs=0.01)


def test_n_choices_are_that_many_streams_sharing_the_tokens() -> None:
    live, clock = live_at()
    flight = live.begin("m", streams=2)
    clock.now = 1.1
    sample = live.end(flight, completed=True, tokens=(5, 22), first_content_at=0.1, last_chunk_at=1.1, streamed=True)
    assert sample is not None
    assert sample.decode_tok_s == pytest.approx((11 - 1) / 1.0)  # 11 tokens per stream
    assert (sample.concurrency, sample.alone) == (pytest.approx(2.0), False)


def test_failed_and_abandoned_requests_are_not_samples_but_free_their_streams() -> None:
    live, clock = live_at()
    failed = live.begin("m")
    clock.now = 1.0
    assert live.end(failed, completed=False, tokens=None) is None
    assert live.end(failed, completed=True, tokens=(1, 5)) is None  # a second end does nothing
    sample = streamed(live, clock, start=2.0, first=2.1, last=3.1, tokens=(3, 11))
    assert sample is not None and sample.alone and sample.concurrency == pytest.approx(1.0)
    assert live.summary("m")["window_requests"] == 1


def test_the_window_keeps_only_the_last_requests() -> None:
    live, clock = live_at(window=3)
    for i in range(5):
        streamed(live, clock, start=float(i), first=i + 0.1, last=i + 0.6, tokens=(i, 11))
    assert [s.prompt_tokens for s in live.samples("m")] == [2, 3, 4]
    summary = live.summary("m")
    assert (summary["window_requests"], summary["window_limit"]) == (3, 3)
    assert summary["window_age_s"] == pytest.approx(2.0)  # the oldest kept finished at 2.6, now is 4.6


def test_an_empty_window_is_nulls_and_valid_json() -> None:
    live, _ = live_at()
    assert live.summary("m") == {
        "window_requests": 0, "window_limit": 200, "window_age_s": None, "streamed_requests": 0,
        "decode_tok_s_per_stream": None, "decode_tok_s_single_stream": None, "unary_tok_s": None, "ttft_s": None,
        "mean_prompt_tokens": None, "mean_cached_prompt_tokens": None, "mean_concurrent_streams": None,
        "ratio_to_predicted": None,
    }  # fmt: skip
    live.predictions["m"] = PREDICTION
    summary = live.summary("m")
    assert summary["ratio_to_predicted"] == {"decode_single": None, "decode_per_stream": None, "ttft": None}
    json.dumps(summary, allow_nan=False)
    assert live.medians() == {}


def test_decode_ratios_use_the_plans_formula_at_each_requests_own_length_and_concurrency() -> None:
    """A GPU step that only reads memory: 1 GB of weights + 1 MB per token of every session, at 1,000 GB/s of
    copy bandwidth. A request of 1,000 prompt tokens that generated 400 decoded at a mean length of 1,200."""
    reads = Workload("llamacpp", StepCost(0, 0, 0), 1, gpu_weight_bytes=1e9, gpu_kv_bytes_per_token=1e6, gpu_params=1)
    gpu = GPUSpec("test", 1e12 / COPY_EFFICIENCY, 1e9)
    prediction = PREDICTION.model_copy(update={"inputs": PredictionInputs(gpu=gpu, workload=reads)})
    alone = Sample(1000, 1.0, True, 0.0, streamed=True, ttft_s=0.1, decode_tok_s=400.0, generated_tokens=400)
    pair = Sample(1000, 2.0, False, 0.0, streamed=True, ttft_s=0.1, decode_tok_s=250.0, generated_tokens=400)
    ratios = summarize([alone, pair], prediction, now=1.0, window=200)["ratio_to_predicted"]
    assert ratios["decode_single"] == pytest.approx(400 / (1 / 2.2e-3))  # (1 GB + 1,200 MB) / 1,000 GB/s
    assert ratios["decode_per_stream"] == pytest.approx((0.88 + 250 / (1 / 3.4e-3)) / 2)  # 2 sessions: 3.4 ms


def test_ratios_set_measurements_against_the_prediction() -> None:
    samples = [
        Sample(400, 1.0, True, 0.0, streamed=True, ttft_s=0.82, decode_tok_s=80.0),  # alone
        Sample(400, 2.5, False, 0.0, streamed=True, ttft_s=5.0, decode_tok_s=50.0),  # beside others
        Sample(100, 1.0, True, 0.0, unary_tok_s=30.0),  # unary: no decode or TTFT ratio
    ]
    assert predicted_ttft(PREDICTION, 400) == pytest.approx(0.4 + 0.01)
    summary = summarize(samples, PREDICTION, now=1.0, window=200)
    ratios = summary["ratio_to_predicted"]
    assert ratios["decode_single"] == pytest.approx(0.8)  # 80 measured alone against 100
    # per request: 80 / 100 alone, 50 / 57.1 at 2.5 streams (17.5 ms a step); p50 of 0.8 and 0.875
    assert ratios["decode_per_stream"] == pytest.approx((0.8 + 0.875) / 2, abs=1e-3)
    assert ratios["ttft"] == pytest.approx(2.0)  # only the request that ran alone: 0.82 against 0.41
    assert summary["decode_tok_s_per_stream"] == {"n": 2, "p50": 65.0, "mean": 65.0}
    assert summary["decode_tok_s_single_stream"] == {"n": 1, "p50": 80.0, "mean": 80.0}
    assert summary["ttft_s"] == {"n": 2, "p50": pytest.approx(2.91), "p90": pytest.approx(4.582)}
    assert summary["mean_prompt_tokens"] == 300.0
    assert summary["streamed_requests"] == 2


def test_the_ttft_prediction_leaves_out_prompt_tokens_served_from_the_prefix_cache() -> None:
    live, clock = live_at()
    live.predictions["m"] = PREDICTION
    flight = live.begin("m")
    clock.now = 1.0
    sample = live.end(flight, completed=True, tokens=(500, 11), first_content_at=0.11, last_chunk_at=1.0,
                      streamed=True, cached_tokens=400)  # fmt: skip
    assert sample is not None and sample.cached_tokens == 400
    summary = live.summary("m")
    assert summary["mean_cached_prompt_tokens"] == 400.0
    # a 10 ms step, then 100 tokens to prefill at 1,000 tok/s: 0.11 s predicted, 0.11 s measured
    assert summary["ratio_to_predicted"]["ttft"] == pytest.approx(1.0)


PLACEMENT: dict[str, Any] = {
    "inventory": {"gpus": []},
    "decisions": [
        {"model": "m", "rung": "llamacpp-gguf", "prediction": PREDICTION.model_dump(mode="json")},
        {"model": "refused", "refusal": "does not fit", "prediction": None},
    ],
    "start_order": ["m"],
}


def test_placement_gains_measured_beside_each_prediction_and_keeps_its_keys() -> None:
    live, clock = live_at()
    live.predictions = predictions_from_placement(PLACEMENT, {"m"})
    streamed(live, clock, start=0.0, first=0.05, last=1.05, tokens=(50, 101))
    before = json.dumps(PLACEMENT)
    shown = placement_with_measured(PLACEMENT, live, {"m"})
    assert json.dumps(PLACEMENT) == before  # the startup report is left as it was
    assert shown["inventory"] == PLACEMENT["inventory"] and shown["start_order"] == ["m"]
    m, refused = shown["decisions"]
    assert {k: v for k, v in m.items() if k != "measured"} == PLACEMENT["decisions"][0]
    assert m["measured"]["window_requests"] == 1
    assert m["measured"]["ratio_to_predicted"]["decode_single"] == pytest.approx(1.0)  # 100 tok/s, as predicted
    assert refused["measured"] is None
    json.dumps(shown, allow_nan=False)


def test_predictions_are_taken_for_served_models_only() -> None:
    assert predictions_from_placement(PLACEMENT, {"m"}) == {"m": PREDICTION}
    assert predictions_from_placement(PLACEMENT, {"refused"}) == {}
    assert predictions_from_placement({}, {"m"}) == {}


def gauges(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }


def test_metrics_show_the_prediction_and_the_measured_p50s() -> None:
    live, clock = live_at()
    metrics = Metrics(gpu=False, live=live)
    metrics.set_predictions({"m": PREDICTION})
    assert live.predictions == {"m": PREDICTION}
    assert not [name for name, _ in gauges(metrics) if name.startswith("voltgate:measured_")]  # nothing measured yet
    streamed(metrics.live, clock, start=0.0, first=0.2, last=1.2, tokens=(9, 31))
    streamed(metrics.live, clock, start=2.0, first=2.4, last=3.4, tokens=(9, 51))
    out = gauges(metrics)
    assert out[("voltgate:predicted_decode_tokens_per_second", (("model", "m"), ("streams", "1")))] == 100.0
    assert out[("voltgate:predicted_decode_tokens_per_second", (("model", "m"), ("streams", "4")))] == 40.0
    assert out[("voltgate:predicted_ttft_seconds", (("model", "m"),))] == pytest.approx(0.522)
    assert out[("voltgate:measured_decode_tokens_per_second", (("model", "m"),))] == pytest.approx(40.0)  # 30, 50
    assert out[("voltgate:measured_ttft_seconds", (("model", "m"),))] == pytest.approx(0.3)  # 0.2, 0.4


def test_prefill_seconds_come_from_the_measured_prefill_speed_else_from_the_plan() -> None:
    live, clock = live_at()
    assert live.prefill_seconds("m", 1000) is None  # no measurement, no prediction
    live.predictions["m"] = PREDICTION
    predicted = live.prefill_seconds("m", 1000)
    assert predicted == pytest.approx(PREDICTION.ttft_at(1000))  # no overhead in this plan: all of it prefill
    flight = live.begin("m")
    clock.now = 1.0
    live.end(flight, completed=True, tokens=(500, 11), first_content_at=0.2, last_chunk_at=1.0, streamed=True,
             cached_tokens=100)  # fmt: skip  # 400 tokens prefilled in 0.2 s: 2,000 tok/s measured
    assert live.prefill_seconds("m", 1000) == pytest.approx(0.5)
