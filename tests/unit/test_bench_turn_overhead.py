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
        "main (w.py:1);prepare (p.py:9);render (t.py:3);render (t.py:4) 6\n"
        "main (w.py:1);prepare (p.py:9);tokenize (n.py:2) 3\n"
        "main (w.py:1);_step (s.py:5);decode (n.py:7) 1\n"
    )
    found = _summarise(raw)
    assert found["samples"] == 10
    assert found["under"] == {"prepare": 9, "render": 6, "tokenize": 3, "_step": 1, "decode": 1}
    assert next(iter(found["leaves"])) == "render (t.py:4)"
