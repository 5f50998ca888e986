"""One model's whole-GPU ladder, in tiers; `gateway.placement.choice` chooses among the deciding tier's fits.

Tiers are tried in order; the first with any fit decides, except that tier 2 is also tried, and the fits of both
chosen from, when no fit of tier 1 reaches the useful-speed floor (or, for objective quality, when one with more
weight bits than every fit that reaches it is below it: its quantized KV may be fast enough):

1. targets: the configured context and concurrency with full-precision KV. TurboMind FP16 on one GPU, then
   tensor-parallel over 2, 4, 8 identical GPUs; then KV int8 at a tp where the FP16 KV target exceeds the room
   left for KV by at most KV_INT8_SMALL_MISS (25 %): tensor parallelism that holds the FP16 KV comes first.
   TurboMind W4A16 the same way; then llama.cpp with every layer on GPUs, one option per GGUF, highest-bit first.
2. quantized KV: the same targets with KV int8 however large the miss (TurboMind, head_dim 128) or KV q8_0
   (llama.cpp, needs flash attention): every layer stays on the GPU.
3. fewer sessions: the most sessions below `concurrency` that fit; the others wait in the gateway's queue.
   Only the fits that serve the most sessions are chosen from.
4. shorter session: the longest session down to `min_context`.

Partial offload and the CPU come only after all four (the policy's second pass). In the deciding tier every fit
is predicted and `choose` applies the floor and the model's objective (quality by default: the highest
precision that reaches the floor). Neither speed nor precision buys more GPUs than the tier's first fit uses:
those stay for other models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.placement.choice import Choice, choose, settled
from gateway.placement.rungs import (
    LC_GPU,
    TM_FP16,
    TM_TP,
    TM_W4A16,
    Miss,
    ModelWork,
    Placed,
    try_llamacpp_gpu,
    try_turbomind,
)

KV_INT8_SMALL_MISS = 0.25
"""Tier 1 takes KV int8 only when the FP16 KV needs at most 25 % more than the room it has."""
SESSION_STEP = 256
"""Shortened sessions are multiples of this (or min_context itself)."""


class Option(Protocol):
    """One way to place the model whole on GPUs; called with a session length and a number of sessions
    (None: the configured ones). None means "not applicable here", with nothing to record."""

    @property
    def rung(self) -> str: ...

    @property
    def rescue(self) -> bool:
        """Tried in tiers 1-2 only (a rescue, or a rung ruled out); never shrunk in tiers 3-4."""
        ...

    def __call__(self, session: int, sessions: int | None, /) -> Placed | Miss | None: ...


@dataclass(frozen=True)
class TurboMindOption:
    work: ModelWork
    rung: str
    source_index: int
    w4a16: bool
    budgets: dict[int, int]
    tp: int
    policy: int
    rescue: bool = False
    """KV int8 as the tier-1 rescue: tried only when the FP16 KV misses by at most KV_INT8_SMALL_MISS."""

    def __call__(self, session: int, sessions: int | None) -> Placed | Miss | None:
        source = (self.work.w4a16 if self.w4a16 else self.work.fp16)[self.source_index]
        count = sessions or self.work.spec.concurrency
        notes: tuple[str, ...] = ()
        if self.rescue:
            fp16 = try_turbomind(self.work, self.rung, source, self.budgets, self.tp, session, policy=0, sessions=count)
            if not isinstance(fp16, Miss) or fp16.kv_short is None or fp16.kv_short > KV_INT8_SMALL_MISS:
                return None
            assert fp16.shortfall is not None
            notes = (
                f"KV int8 (quant_policy 8): with fp16 KV it is short by {fp16.shortfall.gib:.2f} GiB "
                f"({fp16.kv_short:.0%} more KV than fits; int8 rescues misses up to {KV_INT8_SMALL_MISS:.0%})",
            )
        elif self.policy == 8 and self.work.spec.lmdeploy.quant_policy is None:
            notes = ("KV int8 (quant_policy 8): the fp16 KV cache for these sessions fits at no tp",)
        return try_turbomind(
            self.work, self.rung, source, self.budgets, self.tp, session, policy=self.policy, sessions=count,
            notes=notes,
        )  # fmt: skip


@dataclass(frozen=True)
class RuledOut:
    """A rung ruled out before any fit is tried (no such source, an override): recorded once, in tier 1."""

    rung: str
    reason: str
    rescue: bool = True

    def __call__(self, _session: int, _sessions: int | None, /) -> Placed | Miss | None:
        return Miss(self.rung, self.reason)


@dataclass(frozen=True)
class LlamaCppOption:
    work: ModelWork
    source_index: int
    budgets: dict[int, int]
    slots: int
    kv: str
    rung: str = LC_GPU
    rescue: bool = False

    def __call__(self, session: int, sessions: int | None) -> Placed | Miss | None:
        source = self.work.ggufs[self.source_index]
        return try_llamacpp_gpu(self.work, source, self.budgets, session, sessions or self.slots, self.kv)


def turbomind_options(
    work: ModelWork, budgets: dict[int, int], tps: list[int], *, w4a16: bool
) -> tuple[list[Option], list[Option]]:
    """Tier-1 and tier-2 TurboMind options (FP16 or W4A16 sources), in ladder order: per source, fp16 KV at
    every tp, then the small-miss int8 rescue at every tp; tier 2 holds int8 at every tp for any miss."""
    forced = work.spec.lmdeploy.quant_policy
    first: list[Option] = []
    second: list[Option] = []
    for index, source in enumerate(work.w4a16 if w4a16 else work.fp16):
        for tp in tps:
            rung = TM_W4A16 if w4a16 else TM_TP if tp > 1 else TM_FP16
            first.append(TurboMindOption(work, rung, index, w4a16, budgets, tp, forced or 0))
        if forced is None and source.shape.head_dim == 128:
            for rescue, tier in ((True, first), (False, second)):
                for tp in tps:
                    rung = TM_W4A16 if w4a16 else TM_TP if tp > 1 else TM_FP16
                    tier.append(TurboMindOption(work, rung, index, w4a16, budgets, tp, 8, rescue))
    return first, second


def llamacpp_options(work: ModelWork, budgets: dict[int, int], slots: int) -> tuple[list[Option], list[Option]]:
    """Every layer on GPUs: each GGUF with f16 KV (tier 1), then each with q8_0 KV (tier 2)."""
    first: list[Option] = [LlamaCppOption(work, i, budgets, slots, "f16") for i in range(len(work.ggufs))]
    second: list[Option] = []
    if work.spec.llamacpp.flash_attn:
        second = [LlamaCppOption(work, i, budgets, slots, "q8_0") for i in range(len(work.ggufs))]
    return first, second


def climb(work: ModelWork, budgets: dict[int, int], tiers: tuple[list[Option], list[Option]]) -> Choice:
    """Walk the four tiers (module docstring) and choose within the first that has a fit."""
    spec = work.spec
    choice = Choice()
    options = [*tiers[0], *tiers[1]]
    fits: list[Placed] = []
    for tier in tiers:
        fits += _evaluate(tier, spec.context, None, choice.misses)
        if fits and settled(work, budgets, fits):
            break
    if fits:
        return choose(work, budgets, fits, choice)
    if spec.concurrency > 1:
        shrinkable = [
            o for o in options if not o.rescue and not (isinstance(o, LlamaCppOption) and spec.llamacpp.slots)
        ]
        fits = [f for f in (_most_sessions(o, spec.context, spec.concurrency) for o in shrinkable) if f]
        if fits:
            most = max(f.capacity for f in fits)  # serving more sessions beats precision and speed here
            placed = choose(work, budgets, [f for f in fits if f.capacity == most], choice)
            assert placed.placed is not None
            served = placed.placed.capacity
            choice.warnings.append(
                f"fewer sessions: {served} of the {spec.concurrency} configured sessions are served at once "
                f"({placed.placed.rung}); the other requests wait in the gateway's queue (max_queue {spec.max_queue})"
            )
            return placed
    if spec.min_context is not None and spec.min_context < spec.context:
        return _shorter(work, budgets, options, choice)
    return choice


def _evaluate(options: list[Option], session: int, sessions: int | None, misses: list[Miss]) -> list[Placed]:
    fits = []
    for option in options:
        result = option(session, sessions)
        if isinstance(result, Placed):
            fits.append(result)
        elif result is not None:
            misses.append(result)
    return fits


def _most_sessions(option: Option, session: int, wanted: int) -> Placed | None:
    """The most sessions below `wanted` that fit (fit is monotone in sessions), or None."""
    best, lo, hi = None, 1, wanted - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        result = option(session, mid)
        if isinstance(result, Placed):
            best, lo = result, mid + 1
        else:
            hi = mid - 1
    return best


def _shorter(work: ModelWork, budgets: dict[int, int], options: list[Option], choice: Choice) -> Choice:
    """Tier 4: each option's longest session down to min_context; the longest of those decide."""
    spec = work.spec
    assert spec.min_context is not None
    sessions = sorted({spec.min_context, *range(_round_up(spec.min_context), spec.context, SESSION_STEP)})
    fits: list[Placed] = []
    for option in (o for o in options if not o.rescue):
        shortest = option(sessions[0], None)
        if not isinstance(shortest, Placed):
            if isinstance(shortest, Miss) and shortest.shortfall is not None:
                choice.misses.append(Miss(f"{shortest.rung} @ {spec.min_context}", shortest.reason, shortest.shortfall))
            continue
        best, lo, hi = shortest, 1, len(sessions) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            result = option(sessions[mid], None)
            if isinstance(result, Placed):
                best, lo = result, mid + 1
            else:
                hi = mid - 1
        fits.append(best)
    if not fits:
        return choice
    longest = max(f.plan.context_tokens for f in fits)
    chosen = choose(work, budgets, [f for f in fits if f.plan.context_tokens == longest], choice)
    assert chosen.placed is not None
    choice.warnings.append(
        f"session shortened from {spec.context} to {longest} tokens (min_context {spec.min_context}) "
        f"to fit {chosen.placed.rung}"
    )
    return chosen


def _round_up(n: int) -> int:
    return -(-n // SESSION_STEP) * SESSION_STEP
