"""The benchmark statistics: percentiles, per-stream decode speed and level summaries."""

from __future__ import annotations

import math

import pytest

from bench.stats import RequestRecord, bootstrap_median_ci, distribution, percentile, ratio, summarize


def test_percentile_interpolates_like_numpy_linear():
    values = [10.0, 20.0, 30.0, 40.0]
    assert percentile(values, 50) == 25.0
    assert percentile(values, 0) == 10.0
    assert percentile(values, 100) == 40.0
    assert math.isclose(percentile(values, 90), 37.0)
    assert percentile([5.0], 99) == 5.0


def test_percentile_of_nothing_is_none_and_bad_q_is_refused():
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_distribution_scales_seconds_to_milliseconds():
    d = distribution([0.001, 0.003], scale=1000)
    assert d["mean"] == pytest.approx(2.0)
    assert d["p50"] == pytest.approx(2.0)


def test_decode_speed_excludes_the_first_token():
    rec = RequestRecord(index=0, ok=True, ttft_s=0.5, e2e_s=1.5, output_tokens=11)
    assert rec.decode_tok_s == pytest.approx(10.0)
    assert RequestRecord(index=1, ok=True, ttft_s=0.5, e2e_s=0.6, output_tokens=1).decode_tok_s is None


def _ok(index: int, ttft: float, e2e: float, tokens: int, chunks: int) -> RequestRecord:
    step = (e2e - ttft) / (tokens - 1)
    return RequestRecord(
        index=index,
        ok=True,
        status=200,
        ttft_s=ttft,
        e2e_s=e2e,
        itl_s=[step] * (tokens - 1),
        prompt_tokens=8,
        output_tokens=tokens,
        chunks=chunks,
        content_chunks=tokens,
    )


def test_summary_counts_only_successes_in_rates_and_tallies_errors():
    records = [
        _ok(0, 0.1, 1.1, 11, 12),
        _ok(1, 0.3, 2.3, 11, 12),
        RequestRecord(index=2, status=503, error="http_503"),
        RequestRecord(index=3, status=200, error="stream_error"),
        RequestRecord(index=4, status=503, error="http_503"),
    ]
    s = summarize(records, duration_s=2.0)
    assert s["requests"] == 5
    assert s["completed"] == 2
    assert s["errors"] == {"http_503": 2, "stream_error": 1}
    assert s["output_tokens"] == 22
    assert s["output_throughput"] == pytest.approx(11.0)
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["chunk_throughput"] == pytest.approx(12.0)
    assert s["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert s["tpot_ms"]["p50"] == pytest.approx(150.0)
    assert s["itl_ms"]["p50"] == pytest.approx(150.0)
    assert s["decode_tok_s_per_stream"]["p50"] == pytest.approx(7.5)


def test_summary_of_an_empty_level_has_no_rates():
    s = summarize([], duration_s=0.0)
    assert s["completed"] == 0
    assert s["output_throughput"] is None
    assert s["ttft_ms"]["p50"] is None


def test_ratio_guards_missing_and_zero():
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None
    assert ratio(1.0, 0.0) is None


def test_bootstrap_ci_brackets_the_median_and_is_deterministic():
    values = [float(v) for v in range(1, 42)]
    lo, hi = bootstrap_median_ci(values)
    assert lo <= 21.0 <= hi
    assert hi - lo < 20
    assert bootstrap_median_ci(values) == (lo, hi)
    assert bootstrap_median_ci([1.0]) is None
