"""The enum-stall benchmark's arithmetic: gaps, their percentiles in ms, the issue's ratio (beside max / alone p99)
and the pooled summary over repetitions."""

from __future__ import annotations

import pytest

from bench.enum_stall import enum_schema, gap_stats, gaps_of, overall, ratio, summarize


def test_gaps_are_the_differences_between_consecutive_chunk_times():
    assert gaps_of([1.0, 1.5, 1.75]) == pytest.approx([0.5, 0.25])
    assert gaps_of([1.0]) == []


def test_gap_stats_are_milliseconds_and_none_without_gaps():
    assert gap_stats([0.010, 0.020, 0.030]) == {"gaps": 3, "p50_ms": 20.0, "p99_ms": 29.8, "max_ms": 30.0}
    assert gap_stats([]) == {"gaps": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}


def test_ratio_is_the_largest_gap_beside_over_the_p99_alone():
    alone = [0.010] * 99 + [0.020]  # p99 interpolates between the two largest: 10.1 ms
    assert ratio(alone, [0.010, 0.0202]) == 2.0
    assert ratio([], [0.01]) is None
    assert ratio([0.01], []) is None


def test_summary_flags_the_bar_at_twice_the_p99():
    assert summarize([0.010] * 10, [0.019])["under_bar"] is True
    assert summarize([0.010] * 10, [0.020])["under_bar"] is False
    assert summarize([], [0.01])["under_bar"] is None


def test_overall_pools_every_repetitions_gaps():
    rows = [
        {"alone": {"gaps_s": [0.010, 0.010]}, "beside": {"gaps_s": [0.011], "heavy_s": 12.0, "heavy_status": 200,
                                                         "stream_ended_first": True}},
        {"alone": {"gaps_s": [0.010]}, "beside": {"gaps_s": [0.030], "heavy_s": None, "heavy_status": 400,
                                                  "stream_ended_first": False}},
    ]  # fmt: skip
    total = overall(rows)
    assert total["alone"]["gaps"] == 3 and total["beside"]["max_ms"] == 30.0
    assert total["ratio"] == 3.0 and total["under_bar"] is False
    assert total["heavy_status"] == [200, 400] and total["stream_ended_first"] == [True, False]


def test_the_enum_is_deterministic_and_distinct():
    assert enum_schema(50) == enum_schema(50)
    assert len(set(enum_schema(500)["enum"])) == 500
