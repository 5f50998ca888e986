"""Rendering of bench results: markdown tables, the overhead headline against the issue's goals, plots."""

from __future__ import annotations

from pathlib import Path

from bench import batching, overhead, plots, report


def test_md_table_escapes_pipes_and_aligns_columns():
    text = report.md_table(["a", "b"], [[1, "x|y"]])
    assert text.splitlines() == ["| a | b |", "|---|---|", "| 1 | x\\|y |"]


def test_fmt_handles_missing_bools_percentages_and_thousands():
    assert report.fmt(None) == "-"
    assert report.fmt(True) == "yes"
    assert report.fmt(0.981, 1, pct=True) == "98.1%"
    assert report.fmt(12345.678, 0) == "12,346"


def _tput(direct: float, gateway: float, cpu_per_1k: float | None = None) -> dict:
    def path(tok_s: float, cpu: float | None) -> dict:
        return {"summary": {"output_throughput": tok_s, "chunk_throughput": tok_s}, "relay_cpu_s_per_1k_chunks": cpu}

    g = path(gateway, cpu_per_1k)
    g["output_throughput_ratio_to_direct"] = gateway / direct
    return {"direct": path(direct, None), "gateway": g}


def test_headline_checks_the_issue_goals():
    result = {
        "real_worker": {
            "ttft_c1": {"gateway": {"added_ttft_ms_p50": 1.5}},
            "throughput": {"c1": _tput(100.0, 99.0), "c8": _tput(400.0, 380.0, 0.2)},
        },
        "zero_upstream": {
            "ttft_c1": {"gateway": {"added_ttft_ms_p50": 3.0, "added_ttft_ms_paired_p50": 2.9}},
            "throughput": {"c8": _tput(1000.0, 800.0, 0.01)},
        },
        "zero_paced": {"throughput": {"c16": _tput(1000.0, 990.0, 0.05)}},
    }
    h = overhead.headline(result)
    assert h["cpu_s_per_1k_chunks"]["gateway"] == {"zero_paced": 0.05, "zero_instant_c8": 0.01, "real_c8": 0.2}
    assert h["goals"]["cpu_judged_on"] == 0.05  # paced chunks, not the instant ones
    assert h["goals"]["cpu_met"] is True
    assert h["goals"]["added_ttft_judged_on"] == 2.9  # zero upstream, paired, wins over the real worker's
    assert h["goals"]["added_ttft_met"] is False
    assert h["added_ttft_ms"]["gateway"]["zero_paired"] == 2.9
    assert h["goals"]["throughput_ratio_met"] is False  # c=8 is at 0.95
    assert h["chunks_per_s_zero_c8"] == {"direct": 1000.0, "gateway": 800.0}
    assert "| relay CPU-s per 1k streamed chunks: zero upstream, paced 1 ms, c=16 | 0.050 |" in (
        report.overhead_tables({**result, "headline": h})
    )


def test_headline_without_measurements_leaves_goals_open():
    h = overhead.headline({})
    assert h["goals"]["cpu_met"] is None
    assert h["goals"]["throughput_ratio_met"] is None


def test_plots_write_one_line_per_series(tmp_path):
    series = [
        {
            "label": "1 slot",
            "levels": [
                {"concurrency": c, "summary": {"output_throughput": 10.0, "ttft_ms": {"p50": 5.0 * c}}} for c in (1, 4)
            ],
        },
        {"label": "16 slots", "levels": [{"concurrency": 1, "summary": {"output_throughput": None}}]},
    ]
    assert plots.points(series[0], lambda s: s["output_throughput"]) == ([1, 4], [10.0, 10.0])
    assert plots.points(series[1], lambda s: s["output_throughput"]) == ([], [])
    paths = plots.plot_sweeps(series, tmp_path, note="test")
    assert [p.name for p in paths] == ["throughput_vs_concurrency.png", "ttft_vs_concurrency.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_quant_label_comes_from_the_gguf_file_name():
    assert batching.quant_label(Path("/m/SmolLM2-135M-Instruct.Q4_1.gguf")) == "Q4_1"
    assert batching.quant_label(Path("llama-2-7b.Q4_K_M.gguf")) == "Q4_K_M"
    assert batching.quant_label(Path("llama-2-7b-f16.gguf")) == "F16"
    assert batching.quant_label(Path("model.gguf")) == "GGUF"


LIVE = {
    "prediction": {"decode_tok_s_1": 141.6, "decode_tok_s_per_stream": 37.0, "sessions": 4, "ttft_s": 2.033},
    "measured": {
        "decode_tok_s_single_stream": {"n": 8, "p50": 60.7},
        "decode_tok_s_per_stream": {"n": 12, "p50": 59.2},
        "ttft_s": {"n": 12, "p50": 0.0206},
        "mean_prompt_tokens": 39.0,
        "mean_cached_prompt_tokens": 25.3,
        "mean_concurrent_streams": 2.0,
        "ratio_to_predicted": {"decode_single": 0.429, "decode_per_stream": 0.435, "ttft": 1.702},
    },
    "client_decode_tok_s_p50": {"alone": 60.7, "4_at_once": 23.1},
}


def test_live_speed_table_sets_prediction_gateway_and_client_side_by_side():
    rows = report.live_speed_table(LIVE).splitlines()
    assert rows[2].split("|")[2:6] == [" 141.6 ", " 60.7 ", " 60.7 ", " 0.429 "]
    assert "37.0 at 4 streams" in rows[3] and "23.1 (all at once)" in rows[3] and "0.435" in rows[3]
    assert "0.0206 for 39.0 (25.3 cached)" in rows[4]


def test_a_suite_with_live_speed_has_its_section_and_one_without_measurements_does_not_fail():
    suite = {"date": "2026-12-01", "meta": {}, "live_speed": LIVE}
    assert "## Predicted against measured on live traffic" in report.suite_summary(suite)
    empty = report.live_speed_table({"prediction": None, "measured": None})
    assert "| decode tok/s, a stream alone | None | None | None | None |" in empty
