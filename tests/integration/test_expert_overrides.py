"""`native.expert_overrides`: the tensor buffer overrides behind `--n-cpu-moe` (llama.cpp's patterns, null-ended)."""

from __future__ import annotations

import re

from backends.llamacpp.worker.native import expert_overrides


def test_none_for_no_layers_one_pattern_per_layer_otherwise_and_one_for_all() -> None:
    assert expert_overrides(0) is None
    two = expert_overrides(2)
    assert two is not None and len(two) == 3
    experts = rb"\.ffn_(up|down|gate)_(ch|)exps"
    assert [e.pattern for e in two] == [rb"blk\.0" + experts, rb"blk\.1" + experts, None]
    assert two[0].buft and two[0].buft == two[1].buft and two[2].buft is None  # the CPU buffer type, then the end
    every = expert_overrides(-1)
    assert every is not None and len(every) == 2


def test_the_patterns_match_the_experts_of_their_layers_only() -> None:
    two = expert_overrides(2)
    assert two is not None
    patterns = [re.compile(e.pattern.decode()) for e in two if e.pattern]
    moved = [n for n in ("blk.0.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight", "blk.1.ffn_gate_exps.weight",
                         "blk.2.ffn_up_exps.weight", "blk.0.ffn_up_shexp.weight", "blk.0.attn_q.weight",
                         "blk.10.ffn_up_exps.weight") if any(p.search(n) for p in patterns)]  # fmt: skip
    assert moved == ["blk.0.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight", "blk.1.ffn_gate_exps.weight"]
