"""The hybrid-checkpoints bench says where two greedy answers part and how close the call was there
(`bench.hybrid_checkpoints_cpu.divergence`): the GPU run's one parting read as a near tie from it."""

from __future__ import annotations

from bench.hybrid_checkpoints_cpu import divergence


def answer(*tops: dict[str, float]) -> dict[str, object]:
    return {"session": 2, "turn": 2, "top": list(tops)}


def test_the_first_token_whose_likeliest_differs_is_reported_with_both_sides_top_two_gap() -> None:
    same = {" a": -0.1, " b": -2.0}
    on = answer(same, {" Partition": -2.815, "Examples": -2.882}, {" x": -1.0, " y": -1.5})
    off = answer(same, {" digging": -2.799, " Partition": -2.862}, {" z": -1.0, " y": -1.5})
    split = divergence(on, off)
    assert split is not None and split["token"] == 1
    assert split["top2_gap"] == {"on": 0.067, "off": 0.063}


def test_identical_answers_have_no_divergence() -> None:
    tops = ({" a": -0.1, " b": -2.0}, {" c": -0.5, " d": -0.9})
    assert divergence(answer(*tops), answer(*tops)) is None
