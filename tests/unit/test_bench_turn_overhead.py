"""`bench.turn_overhead`'s arithmetic: the session's added cost per turn and the py-spy profile summary."""

from __future__ import annotations

from pathlib import Path

from bench.turn_overhead import TurnCost, _row, _summarise


def test_the_added_cost_is_the_repeat_less_the_one_turn_repeat() -> None:
    cost = TurnCost("claude", 3, 7_865, 7_864, 120.0, 48.5, 300, 12.0)
    assert cost.added_ms == 36.5
    assert _row(cost) == "| claude | 3 | 7865 | 7864 | 120.0 | 48.5 | 300 | 12.0 | 36.5 |"
    assert TurnCost("codex", 1, None, None, None, None, None, 9.0).added_ms is None


def test_a_sample_counts_once_under_each_summed_frame_it_passed_through(tmp_path: Path) -> None:
    raw = tmp_path / "profile.txt"
    raw.write_text(
        "main (w.py:1);PromptBuilder.prepare (p.py:9);ChatTemplate.render (t.py:3);ChatTemplate.render (t.py:4) 6\n"
        "main (w.py:1);PromptBuilder.prepare (p.py:9);Model.tokenize (n.py:2) 3\n"
        "main (w.py:1);Scheduler._step (s.py:5);Model.decode (n.py:7) 1\n"
    )
    found = _summarise(raw, requests=2)  # 10 samples at 200/s over 2 requests: 25 ms a request
    assert found["samples"] == 10 and found["ms_per_request"] == 25.0
    assert found["under_ms"] == {"PromptBuilder.prepare": 22.5, "ChatTemplate": 15.0, "Model.tokenize": 7.5,
                                 "Model.decode": 2.5}  # fmt: skip
    assert next(iter(found["leaves"])) == "ChatTemplate.render"
