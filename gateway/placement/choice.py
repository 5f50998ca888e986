"""The choice among one model's placements that fit wholly on GPUs: the useful-speed floor, then the objective.

Every fit is predicted (gateway.placement.performance) and given a precision: the weights' bits (16 for
FP16/F16, 8 for Q8_0, 6 for Q6_K, 5 for Q5_K_M, 4 for Q4_K_M and AWQ/GPTQ W4A16), then the KV cache's (16, or
8 for KV int8 / q8_0). Among the fits that use no more GPUs than the ladder's first fit (the others stay for
other models):

1. the floor: a fit whose predicted decode tok/s per stream at the configured sessions is below
   `min_tok_s_per_stream` loses to every fit that reaches it, whatever its precision (rule `floor` when a more
   precise fit lost this way); when none reaches it, the fastest wins (rule `none_reach_floor`, with a warning);
2. `objective: quality` (the default): the highest precision wins (rule `highest_precision`); among fits of
   equal precision (TurboMind FP16 and llama.cpp F16, say) the fastest, as in 3, so the batching engine keeps
   many sessions;
3. `objective: speed`: the fastest for `speed_metric` (rule `fastest`): the earliest fit in ladder order whose
   score is within CLOSE (15 %) of the best, so the ladder's order stands where speeds are close.

The plan says which rule chose and what the runner-up would give: the other objective's pick (or, for `floor`,
the more precise fit that was too slow), with its precision and predicted speed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from backends.base import EngineName
from gateway.config import SpeedMetric
from gateway.placement.performance import Prediction, predict_plan
from gateway.placement.report import Alternative, ChoiceReason, ChoiceRule, describe_plan, precision_label
from gateway.placement.rungs import Miss, ModelWork, Placed

CLOSE = 0.15
"""Between fits of equal standing, a later one replaces the ladder's earlier one only when more than 15 % faster."""
_METRIC = {"throughput": "tok/s in total with every session it holds decoding", "latency": "tok/s for one stream"}
_QUANT_BITS = re.compile(r"^[IT]?Q(\d)")


@dataclass(frozen=True, order=True)
class Precision:
    """What a placement keeps of the model: the weights' bits, then the KV cache's; compared in that order."""

    weight_bits: int
    kv_bits: int


def precision_of(placed: Placed) -> Precision:
    """The precision of a placement: from the GGUF's quant label (Q8_0 -> 8), TurboMind's format and KV policy."""
    plan, source = placed.plan, placed.source
    if plan.engine is EngineName.LMDEPLOY:
        declared = source.quant_config.bits if source.quant_config else None
        bits = (declared or 4) if plan.quant else 16  # TurboMind takes only 4-bit AWQ/GPTQ
        return Precision(bits, {0: 16, 8: 8, 4: 4}[plan.quant_policy])
    label = (source.quant or "").upper()
    match = _QUANT_BITS.match(label)
    if match:
        bits = int(match.group(1))
    else:
        bits = {"F32": 32, "F16": 16, "BF16": 16}.get(label, round(source.bits_per_weight))
    return Precision(bits, 8 if plan.kv_cache_type == "q8_0" else 16)


@dataclass
class Choice:
    """What the ladder decided for one model: the placement (or None), the fits passed over with their
    predictions, which rule chose, and every miss, note and warning to record."""

    placed: Placed | None = None
    prediction: Prediction | None = None
    reason: ChoiceReason | None = None
    alternatives: list[Alternative] = field(default_factory=list)
    misses: list[Miss] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def predict_placed(work: ModelWork, placed: Placed, budgets: dict[int, int] | None = None) -> Prediction:
    """The placement's predicted speed; with `budgets`, TurboMind counts the sessions its KV cache would hold
    if the spare memory there became KV (as it does when no other model shares the GPUs)."""
    capacity = placed.capacity
    if budgets is not None and placed.regrow is not None:
        grown = placed.regrow(budgets)
        capacity = grown.capacity if grown is not None else capacity
    concurrency = work.spec.concurrency if placed.plan.engine is EngineName.LMDEPLOY else placed.plan.slots
    gpus = list(work.gpus.values())
    return predict_plan(
        placed.plan, placed.source, gpus, concurrency=concurrency, capacity=capacity, host_threads=work.host_threads
    )


@dataclass(frozen=True, eq=False)
class _Fit:
    """One fit with its prediction and precision; compared by identity (`in` asks "is it this one")."""

    placed: Placed
    speed: Prediction
    precision: Precision
    order: int
    """Place in ladder order."""

    @property
    def gpus(self) -> int:
        return len(self.placed.estimate.gpu_bytes)

    @property
    def per_stream(self) -> float:
        return self.speed.decode_tok_s_per_stream

    @property
    def option(self) -> str:
        return describe_plan(self.placed.rung, self.placed.plan)

    @property
    def label(self) -> str:
        return precision_label(self.placed.plan)


def _fits(work: ModelWork, budgets: dict[int, int], fits: list[Placed]) -> tuple[list[_Fit], list[_Fit]]:
    """Every fit predicted, in ladder order, and those of them that use no more GPUs than the first."""
    predicted = [_Fit(p, predict_placed(work, p, budgets), precision_of(p), i) for i, p in enumerate(fits)]
    return predicted, [f for f in predicted if f.gpus <= predicted[0].gpus]


def settled(work: ModelWork, budgets: dict[int, int], fits: list[Placed]) -> bool:
    """Whether `choose` can decide among these full-precision-KV fits, or the ladder must also try quantized KV:
    none reaches the floor, or (objective quality) one with more weight bits than every fit that reaches it is
    below it, and its quantized-KV variant may reach it."""
    floor = work.settings.min_tok_s_per_stream
    eligible = _fits(work, budgets, fits)[1]
    reach = [f.precision.weight_bits for f in eligible if f.per_stream >= floor]
    if not reach:
        return False
    slow = [f.precision.weight_bits for f in eligible if f.per_stream < floor]
    return work.settings.objective == "speed" or max(slow, default=0) <= max(reach)


def _fastest(fits: list[_Fit], metric: SpeedMetric) -> _Fit:
    """The earliest in ladder order within CLOSE of the best score for `metric`."""
    best = max(f.speed.score(metric) for f in fits)
    return next(f for f in fits if f.speed.score(metric) * (1 + CLOSE) >= best)


def _most_precise(fits: list[_Fit], metric: SpeedMetric) -> _Fit:
    top = max(f.precision for f in fits)
    return _fastest([f for f in fits if f.precision == top], metric)


def choose(work: ModelWork, budgets: dict[int, int], fits: list[Placed], choice: Choice) -> Choice:
    """Choose among `fits` (module docstring); the others become alternatives saying why they lost."""
    settings = work.settings
    metric, floor = settings.speed_metric, settings.min_tok_s_per_stream
    predicted, eligible = _fits(work, budgets, fits)
    reach = [f for f in eligible if f.per_stream >= floor]
    pool = reach or eligible
    speed_pick, quality_pick = _fastest(pool, metric), _most_precise(pool, metric)
    chosen = speed_pick if settings.objective == "speed" or not reach else quality_pick
    rule, runner = _rule(work, chosen, eligible, reach)
    in_pool = {f.order for f in pool}
    by_precision = rule in ("highest_precision", "floor")
    alternatives = {
        f.order: _alternative(f, chosen, predicted, in_pool, work, by_precision=by_precision)
        for f in predicted
        if f is not chosen
    }
    choice.alternatives.extend(alternatives.values())
    choice.reason = ChoiceReason(
        rule=rule,
        summary=_summary(rule, chosen, runner, work, len(reach), speed_pick, quality_pick),
        precision=chosen.label,
        runner_up=alternatives[runner.order] if runner is not None else None,
    )
    if chosen.per_stream < floor:
        choice.warnings.append(
            f"below the useful-speed floor: {chosen.option} is predicted {_tok(chosen.per_stream)} tok/s per stream "
            f"at {_sessions(chosen)}, under min_tok_s_per_stream {floor:g}, and no placement wholly on the GPUs "
            "reaches it (fewer sessions, a shorter context or a smaller quant would be faster)"
        )
    choice.placed, choice.prediction = chosen.placed, chosen.speed
    return choice


def _rule(work: ModelWork, chosen: _Fit, eligible: list[_Fit], reach: list[_Fit]) -> tuple[ChoiceRule, _Fit | None]:
    """Which rule chose `chosen`, and the runner-up: the fit the other objective picks (for `floor`, the most
    precise fit that was too slow; for `none_reach_floor`, the most precise other)."""
    metric, objective = work.settings.speed_metric, work.settings.objective
    others = [f for f in eligible if f is not chosen]
    if not others:
        return "only_fit", None
    if not reach:
        return "none_reach_floor", _most_precise(others, metric)
    slower_precise = [f for f in others if f not in reach and f.precision > chosen.precision]
    if objective == "quality" and slower_precise:
        return "floor", _most_precise(slower_precise, metric)
    candidates = [f for f in others if f in reach] or others
    if objective == "quality":
        return "highest_precision", _fastest(candidates, metric)
    return "fastest", _most_precise(candidates, metric)


def _alternative(
    fit: _Fit, chosen: _Fit, predicted: list[_Fit], pool: set[int], work: ModelWork, *, by_precision: bool
) -> Alternative:
    """A fit not chosen, with why not: more GPUs, below the floor, less precise, or slower."""
    settings = work.settings
    metric, floor = settings.speed_metric, settings.min_tok_s_per_stream
    most_gpus = predicted[0].gpus
    if fit.gpus > most_gpus:
        why = f"uses {fit.gpus} GPUs, more than the ladder's first fit ({most_gpus})"
    elif fit.order not in pool:
        why = (
            f"predicted {_tok(fit.per_stream)} tok/s per stream at {_sessions(fit)}, below the useful-speed floor "
            f"(min_tok_s_per_stream {floor:g})"
        )
    elif by_precision and fit.precision < chosen.precision:
        why = (
            f"lower precision ({fit.label}) than {chosen.label}: objective quality keeps the highest precision "
            f"that reaches the floor (predicted {_tok(fit.per_stream)} vs {_tok(chosen.per_stream)} tok/s per "
            f"stream at {_sessions(chosen)})"
        )
    elif fit.order > chosen.order and fit.speed.score(metric) * (1 + CLOSE) >= chosen.speed.score(metric):
        why = f"within {CLOSE:.0%} of {chosen.option} for {metric}, which comes first in the ladder"
    else:
        why = f"predicted {_tok(fit.speed.score(metric))} vs {_tok(chosen.speed.score(metric))} tok/s for {metric}"
    return Alternative(rung=fit.placed.rung, option=fit.option, precision=fit.label, prediction=fit.speed, why_not=why)


def _summary(
    rule: ChoiceRule, chosen: _Fit, runner: _Fit | None, work: ModelWork, reach: int, speed: _Fit, quality: _Fit
) -> str:
    """One sentence: the rule with the chosen precision and speed, then what the runner-up would give."""
    settings = work.settings
    floor = f"{settings.min_tok_s_per_stream:g} tok/s per stream"
    head = {
        "only_fit": f"{chosen.label} is the only placement wholly on the GPUs that may be chosen",
        "highest_precision": f"objective quality: {chosen.label} is the highest precision of the {reach} fits "
        f"that reach {floor}",
        "fastest": f"objective speed: {chosen.label} is the fastest for {settings.speed_metric}",
        "floor": f"objective quality: {chosen.label} is the highest precision that reaches {floor} "
        "(min_tok_s_per_stream)",
        "none_reach_floor": f"no fit reaches {floor} (min_tok_s_per_stream), so the fastest: {chosen.label}",
    }[rule]
    text = f"{head}; predicted {_gives(chosen, work)}"
    if runner is None:
        return text
    if rule == "floor":
        tail = "more precise but below the floor:"
    elif runner is speed and rule != "fastest":
        tail = "objective: speed would choose"
    elif runner is quality and rule == "fastest":
        tail = "objective: quality would choose"
    else:
        tail = "runner-up:"
    return f"{text}; {tail} {runner.option}: {_gives(runner, work)}"


def _gives(fit: _Fit, work: ModelWork) -> str:
    """A fit's predicted speed: per stream at the configured sessions, and the metric's score where it differs."""
    metric = work.settings.speed_metric
    text = f"{_tok(fit.per_stream)} tok/s per stream at {_sessions(fit)}"
    score = fit.speed.score(metric)
    if abs(score - fit.per_stream) > 0.05:
        text += f" ({_tok(score)} {_METRIC[metric]})"
    return text


def _sessions(fit: _Fit) -> str:
    n = fit.speed.sessions
    return f"{n} session{'s' if n != 1 else ''}"


def _tok(value: float) -> str:
    return f"{value:.1f}" if value < 20 else f"{value:,.0f}"
