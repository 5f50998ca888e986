"""The GPU regression benchmark's table logic (bench/gpu/regress_table.py) and the command lines it derives
(bench/gpu/regress.py), on hand-made phases and results: ABBA order, means, ratios, the previous run's lookup."""

from __future__ import annotations

import json
from pathlib import Path

from bench.gpu.regress import _commit, llama_server_argv, with_port, worker_argv
from bench.gpu.regress_table import (
    LevelMeasure,
    Phase,
    abba_order,
    attach_previous,
    build_rows,
    find_previous,
    phases_from_log,
    render_markdown,
)


def _phase(pair: str, side: str, order: int, *levels: tuple[int, float | None, float | None]) -> Phase:
    label = "worker" if side == "A" else "llama-server"
    measures = tuple(LevelMeasure(s, tok, ttft, 16, 16) for s, tok, ttft in levels)
    return Phase(pair, side, label, order, measures)  # type: ignore[arg-type]


def test_abba_order_runs_a_b_b_a_per_pair_and_a_twice_without_b() -> None:
    assert abba_order(["q4", "q8"]) == [("q4", "A"), ("q4", "B"), ("q4", "B"), ("q4", "A"),
                                       ("q8", "A"), ("q8", "B"), ("q8", "B"), ("q8", "A")]  # fmt: skip
    assert abba_order(["q4"], b_runs=False) == [("q4", "A"), ("q4", "A")]


def test_rows_average_each_side_over_its_phases_and_divide_a_by_b() -> None:
    phases = [
        _phase("q4", "A", 0, (1, 200.0, 50.0), (8, 700.0, 120.0)),
        _phase("q4", "B", 1, (1, 220.0, 48.0), (8, 640.0, 160.0)),
        _phase("q4", "B", 2, (1, 230.0, 52.0), (8, 660.0, 140.0)),
        _phase("q4", "A", 3, (1, 210.0, 60.0), (8, 690.0, 130.0)),
    ]
    one, eight = build_rows(phases)
    assert (one.streams, eight.streams) == (1, 8)
    assert one.a_runs == [200.0, 210.0] and one.b_runs == [220.0, 230.0]
    assert one.a_tok_s == 205.0 and one.b_tok_s == 225.0
    assert abs(one.tok_s_ratio - 205 / 225) < 1e-9  # type: ignore[operator]
    assert one.a_ttft_p50_ms == 55.0 and one.b_ttft_p50_ms == 50.0
    assert abs(one.ttft_ratio - 1.1) < 1e-9  # type: ignore[operator]
    assert abs(eight.tok_s_ratio - 695 / 650) < 1e-9  # type: ignore[operator]
    assert (one.a_label, one.b_label, one.b_status) == ("worker", "llama-server", "measured")


def test_a_row_without_b_says_why_and_has_no_ratio() -> None:
    phases = [_phase("smoke", "A", 0, (1, 6.0, 900.0)), _phase("smoke", "A", 1, (1, 8.0, 1100.0))]
    (row,) = build_rows(phases, {"smoke": "not run: no llama-server on PATH"})
    assert row.a_tok_s == 7.0 and row.b_tok_s is None
    assert row.tok_s_ratio is None and row.ttft_ratio is None
    assert "not run: no llama-server on PATH" in render_markdown([row])


def test_a_level_where_nothing_finished_is_left_out_of_the_mean() -> None:
    phases = [_phase("p", "A", 0, (8, None, None)), _phase("p", "A", 1, (8, 600.0, 100.0))]
    (row,) = build_rows(phases)
    assert row.a_tok_s == 600.0 and row.a_runs == [None, 600.0]


def _write_run(root: Path, name: str, *, mode: str, started: str, ratio: float) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    row = {"pair": "q4", "streams": 8, "tok_s_ratio": ratio, "ttft_ratio": 0.9, "a_tok_s": 700.0}
    data = {"mode": mode, "meta": {"started_utc": started, "git": {"commit": name}}, "rows": [row]}
    (folder / "regress.json").write_text(json.dumps(data))
    return folder


def test_the_previous_run_is_the_newest_of_the_same_mode_other_than_this_one(tmp_path: Path) -> None:
    _write_run(tmp_path, "2026-12-01-gpu", mode="gpu", started="2026-12-01T10:00:00Z", ratio=1.07)
    newest_gpu = _write_run(tmp_path, "2026-12-03-gpu", mode="gpu", started="2026-12-03T10:00:00Z", ratio=0.68)
    _write_run(tmp_path, "2026-12-04-smoke", mode="smoke", started="2026-12-04T10:00:00Z", ratio=1.0)
    this = _write_run(tmp_path, "2026-12-05-gpu", mode="gpu", started="2026-12-05T10:00:00Z", ratio=1.1)
    (tmp_path / "2026-12-06-broken").mkdir()
    (tmp_path / "2026-12-06-broken" / "regress.json").write_text("{not json")
    assert find_previous(tmp_path, exclude=this, mode="gpu") == newest_gpu / "regress.json"
    assert find_previous(tmp_path, exclude=this, mode="smoke") == tmp_path / "2026-12-04-smoke" / "regress.json"
    assert find_previous(tmp_path / "nothing-here", mode="gpu") is None


def test_each_pair_stands_beside_the_newest_run_that_measured_it_nested_folders_included(tmp_path: Path) -> None:
    worker = _write_run(tmp_path / "2026-12-06-regress", "worker-q4", mode="gpu", started="2026-12-06T05:00:00Z",
                        ratio=1.3)  # fmt: skip
    other = tmp_path / "2026-12-06-tm-only"  # newer, but of another pair
    other.mkdir()
    (other / "regress.json").write_text(json.dumps({"mode": "gpu", "meta": {"started_utc": "2026-12-06T09:00:00Z"},
                                                    "rows": [{"pair": "turbomind", "streams": 8}]}))  # fmt: skip
    assert find_previous(tmp_path, mode="gpu", pair="q4") == worker / "regress.json"
    assert find_previous(tmp_path, mode="gpu", pair="turbomind") == other / "regress.json"
    assert find_previous(tmp_path, mode="gpu") == other / "regress.json"  # no pair: the newest of any
    assert find_previous(tmp_path, mode="gpu", pair="moe") is None
    later = _write_run(tmp_path / "2026-12-06-a-later-run", "worker-q4", mode="gpu", started="2026-12-06T07:00:00Z",
                       ratio=1.0)  # fmt: skip
    assert find_previous(tmp_path, mode="gpu", pair="q4") == later / "regress.json"  # same day: its start time


def test_the_previous_runs_numbers_stand_beside_the_matching_rows() -> None:
    rows = build_rows([_phase("q4", "A", 0, (8, 700.0, 120.0), (16, 900.0, 200.0))])
    attach_previous(rows, {"rows": [{"pair": "q4", "streams": 8, "tok_s_ratio": 0.677, "ttft_ratio": 3.9,
                                     "a_tok_s": 535.6}]})  # fmt: skip
    eight, sixteen = rows
    assert (eight.prev_tok_s_ratio, eight.prev_ttft_ratio, eight.prev_a_tok_s) == (0.677, 3.9, 535.6)
    assert sixteen.prev_tok_s_ratio is None
    table = render_markdown(rows, previous=[("q4", "bench/results/x/regress.json", "d1cefbb")])
    assert "previous runs: `bench/results/x/regress.json` (d1cefbb) for q4" in table
    assert "| q4 | 8 | worker | 700.0 |" in table and "| 0.677 | 3.900 | 535.6 |" in table


def test_llama_server_gets_the_workers_exact_choice_with_its_prompt_cache_off() -> None:
    worker = worker_argv(Path("/m/7b-q4_k_m.gguf"), "llama2-7b", 9100, slots=16, ctx=1024, gpu=True, threads=None)
    argv = llama_server_argv(worker, 9200, "/opt/llama-server")
    flags = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert argv[0] == "/opt/llama-server"
    assert flags["-m"] == "/m/7b-q4_k_m.gguf" and flags["--port"] == "9200"
    assert flags["-np"] == "16" and flags["-c"] == str(16 * 1024)  # -c is the total over the slots
    assert flags["-ngl"] == "999" and flags["-ctk"] == "q8_0" and flags["-ctv"] == "q8_0"
    assert flags["-fa"] == "on" and flags["--cache-ram"] == "0"


def test_an_engine_argv_captured_from_a_gateway_gets_a_port_of_its_own() -> None:
    tm = ["python3", "-m", "lmdeploy", "serve", "api_server", "/m", "--server-port", "41000", "--tp", "1"]
    assert with_port(tm, 9300) == [*tm[:7], "9300", "--tp", "1"]
    assert with_port(["w", "--port", "1"], 2) == ["w", "--port", "2"]


def test_llama_server_on_the_cpu_gets_the_workers_automatic_bf16_kv_and_no_gpu_layers() -> None:
    worker = worker_argv(Path("/m/s.gguf"), "s", 9100, slots=4, ctx=1024, gpu=False, threads=2)
    flags = dict(zip(llama_server_argv(worker, 9200)[1::2], llama_server_argv(worker, 9200)[2::2], strict=False))
    assert (flags["-ngl"], flags["-ctk"], flags["-t"], flags["-c"]) == ("0", "bf16", "2", "4096")


def test_the_moe_pairs_split_reaches_llama_server_as_its_own_flag() -> None:
    worker = worker_argv(Path("/m/moe.gguf"), "moe", 9100, slots=8, ctx=1024, gpu=True, threads=None, n_cpu_moe=16)
    assert worker[worker.index("--n-cpu-moe") + 1] == "16"
    argv = llama_server_argv(worker, 9200)
    assert argv[argv.index("--n-cpu-moe") + 1] == "16" and argv[argv.index("-ngl") + 1] == "999"
    plain = llama_server_argv(worker_argv(Path("/m/d.gguf"), "d", 1, slots=1, ctx=64, gpu=True, threads=None), 2)
    assert "--n-cpu-moe" not in plain


def test_a_run_cut_before_its_table_is_read_back_from_its_log() -> None:
    """`--from-log`: the phases a run printed (a header, then a line per level), a phase cut mid-way kept
    with the levels it printed, the loader's own lines ignored."""
    log = "\n".join([
        "== [14:13:45 +659s] bench",
        "== worker-q4_k_m A (worker)",
        "worker-q4_k_m      c=1 ok=16/16 out=228.5 tok/s req=0.84/s ttft p50=44.8 p99=59.9 ms itl p50=4.20 ms errors=-",
        "worker-q4_k_m     c=16 ok=32/32 out=1,972.3 tok/s req=3.72/s ttft p50=99.6 p99=763.3 ms itl p50=1 ms errors=-",
        "== worker-q4_k_m B (llama-server)",
        "worker-q4_k_m      c=1 ok=0/16 out=- tok/s req=0.00/s ttft p50=- p99=- ms itl p50=- ms errors=16",
        "== moe-experts A (worker)",
        "== still running: call this again to keep polling",
    ])  # fmt: skip
    phases = phases_from_log(log)
    assert [(p.pair, p.side, p.label, p.order) for p in phases] == [
        ("worker-q4_k_m", "A", "worker", 0), ("worker-q4_k_m", "B", "llama-server", 1)]  # fmt: skip
    assert phases[0].levels == (LevelMeasure(1, 228.5, 44.8, 16, 16), LevelMeasure(16, 1972.3, 99.6, 32, 32))
    assert phases[1].levels == (LevelMeasure(1, None, None, 0, 16),)


def test_a_previous_runs_commit_is_its_recorded_code_before_what_git_said(tmp_path: Path) -> None:
    """On the GPU machine git answers from the device copy's stale `.git`; the run records `meta.code`
    (bench/gpu/.tree) and the table names that. Older runs without it fall back to git's answer."""
    new, old = tmp_path / "new.json", tmp_path / "old.json"
    new.write_text(json.dumps({"meta": {"code": "72036c3", "git": {"commit": "049753e"}}}))
    old.write_text(json.dumps({"meta": {"git": {"commit": "40cde8b"}}}))
    assert (_commit(new), _commit(old)) == ("72036c3", "40cde8b")
