"""The experts-in-host-memory rung (issue 39): a GGUF mixture of experts too large for the GPUs whole.

How llama.cpp users fit such a model (`--n-cpu-moe N`): every block on the GPUs, its attention, norms, router,
shared experts and KV cache included, except the routed experts of the first N blocks, which stay in host
memory (`backends.llamacpp.worker.native.expert_overrides`). A token reads only its active experts (e.g. 8 of
128), so the host's share of a step is a few percent of those blocks' bytes, where layer-wise offload leaves
whole blocks, attention and KV included, to the CPU. N is the fewest blocks that make the rest fit.

    try_llamacpp_experts(work, budgets, context, slots) -> Placed | [Miss]

The policy tries it beside layer-wise offload (`LC_PARTIAL`) and keeps the faster prediction
(`gateway.placement.performance`: the active experts' share of a step, host bytes over HOST_BANDWIDTH).
"""

from __future__ import annotations

from dataclasses import replace

from gateway.placement.choice import predict_placed
from gateway.placement.estimate import LlamaCppFit, Shortfall, experts_on_host, first_fit, gib
from gateway.placement.inspection import SourceInfo
from gateway.placement.rungs import (
    Miss,
    ModelWork,
    Placed,
    fit_lc,
    host_check,
    layers_note,
    llamacpp_plan,
    try_llamacpp_partial,
)

LC_EXPERTS = "llamacpp-experts-on-host"


def try_llamacpp_experts(work: ModelWork, budgets: dict[int, int], context: int, slots: int) -> Placed | list[Miss]:
    """Each MoE GGUF with every block on the GPUs and the fewest blocks' routed experts in host memory that
    fit; of several GGUFs the one leaving the fewest expert bytes on the host, then the most bits."""
    best: tuple[int, float, Placed] | None = None
    misses: list[Miss] = []
    for source in work.ggufs:
        if not source.layer_expert_bytes:
            misses.append(Miss(LC_EXPERTS, f"{source.quant}: not a mixture of experts (no routed expert tensors)"))
            continue
        fit = _fewest_blocks(work, source, budgets, context, slots)
        if isinstance(fit, Shortfall):
            misses.append(Miss(LC_EXPERTS, f"{source.quant}: even with every block's experts in host memory: "
                                           f"{fit.why}", fit))  # fmt: skip
            continue
        on_host = sum(experts_on_host(source, fit.n_cpu_moe))
        note = (f"the routed experts of {fit.n_cpu_moe} of {source.shape.n_layers} blocks ({gib(on_host)}) in host "
                f"memory; a token reads {source.shape.n_experts_used} of {source.shape.n_experts} experts")  # fmt: skip
        plan = llamacpp_plan(work, source, fit, context, slots)
        placed = Placed(LC_EXPERTS, plan, fit.estimate, source, (layers_note(source, fit), note), capacity=slots)
        host_miss = host_check(work, placed)
        if host_miss:
            misses.append(host_miss)
            continue
        key = (on_host, -source.bits_per_weight)
        if best is None or key < best[:2]:
            best = (on_host, -source.bits_per_weight, placed)
    return replace(best[2], skipped=tuple(misses)) if best else misses


def _fewest_blocks(
    work: ModelWork, source: SourceInfo, budgets: dict[int, int], context: int, slots: int
) -> LlamaCppFit | Shortfall:
    """The smallest N (1..n_layers) whose experts in host memory let every block (and the output head) fit."""
    n_layers = source.shape.n_layers
    return first_fit(
        list(range(1, n_layers + 1)),
        lambda n: fit_lc(work, source, budgets, context, slots, n_layers + 1, n_cpu_moe=n),
    )


def try_llamacpp_offload(work: ModelWork, budgets: dict[int, int], context: int, slots: int) -> Placed | list[Miss]:
    """The policy's offload rung: layer-wise offload and, for a MoE whose split the config does not pin
    (`llamacpp.n_cpu_moe`, or `n_gpu_layers`: a layer count asks for layer-wise offload), experts in host
    memory; of both that place, the faster prediction (aggregate tok/s at the planned sessions), the other
    named among the options passed over."""
    layers = try_llamacpp_partial(work, budgets, context, slots)
    pinned = work.spec.llamacpp.n_cpu_moe or work.spec.llamacpp.n_gpu_layers is not None
    if pinned or not any(s.layer_expert_bytes for s in work.ggufs):
        return layers
    experts = try_llamacpp_experts(work, budgets, context, slots)
    if not isinstance(experts, Placed):
        return layers if isinstance(layers, Placed) else [*experts, *layers]
    if not isinstance(layers, Placed):
        return replace(experts, skipped=(*experts.skipped, *layers))
    fast, slow = (predict_placed(work, experts), predict_placed(work, layers))
    winner, loser, won, lost = (experts, layers, fast, slow) if fast.aggregate_tok_s >= slow.aggregate_tok_s else (
        layers, experts, slow, fast)  # fmt: skip
    why = (f"{loser.plan.quant}: predicted {lost.aggregate_tok_s:,.1f} tok/s for {lost.sessions} session(s), "
           f"against {won.aggregate_tok_s:,.1f} tok/s with {winner.rung}")  # fmt: skip
    return replace(winner, skipped=(*winner.skipped, Miss(loser.rung, why)))
