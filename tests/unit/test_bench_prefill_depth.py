"""The prefill-at-depth bench reports each (new tokens, depth) median beside the same count from position 0
(`bench.prefill_depth.rows`): the engine's own share of a cached turn's TTFT over a one-turn prompt."""

from __future__ import annotations

from bench.prefill_depth import Timing, markdown, rows


def test_each_depth_is_held_to_the_same_count_at_depth_zero() -> None:
    table = rows([Timing(8192, 150, [30.0, 31.0, 90.0]), Timing(0, 150, [20.0, 19.0, 21.0]), Timing(0, 64, [10.0])])
    assert [(r.tokens, r.depth, r.median_ms, r.vs_depth0) for r in table] == [
        (64, 0, 10.0, 1.0),
        (150, 0, 20.0, 1.0),
        (150, 8192, 31.0, 1.55),
    ]


def test_a_count_measured_only_at_depth_has_no_ratio() -> None:
    (row,) = rows([Timing(4096, 300, [12.5])])
    assert row.vs_depth0 is None
    assert "| 300 | 4,096 | 12.50 | - |" in markdown([row], "t")
