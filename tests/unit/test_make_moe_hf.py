"""bench/gpu/make_moe_hf.py's checkpoint as the planner reads it: a Qwen3-MoE whose every block's routed experts
(`mlp.experts.N.*`, not the router `mlp.gate`) are counted, so TurboMind's speed model reads 8 of 128 per token."""

from __future__ import annotations

from pathlib import Path

from bench.gpu import make_moe_hf as moe
from gateway.placement.inspection import inspect_hf_dir


def test_the_sparse_checkpoint_is_a_qwen3_moe_with_its_experts_counted(tmp_path: Path) -> None:
    moe.main([str(tmp_path / "m"), "--layers", "2", "--sparse"])
    info = inspect_hf_dir(tmp_path / "m")
    assert info.shape.n_layers == 2 and info.shape.n_experts == 128 and info.shape.n_experts_used == 8
    per_block = moe.EXPERTS * 3 * moe.EXPERT_WIDTH * moe.HIDDEN * 2
    assert info.layer_expert_bytes == (per_block, per_block)
    router = moe.EXPERTS * moe.HIDDEN * 2
    assert all(
        layer - experts > router for layer, experts in zip(info.layer_bytes, info.layer_expert_bytes, strict=True)
    )
