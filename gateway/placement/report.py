"""The placement report (one decision per model, JSON via pydantic) and its rich table for `voltgate plan`."""

from __future__ import annotations

from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.table import Table
from rich.text import Text

from backends.base import DeploymentPlan, EngineName
from gateway.config import DEFAULT_MIN_TOK_S_PER_STREAM, Objective, SpeedMetric
from gateway.placement.estimate import MemoryEstimate
from gateway.placement.inventory import GIB, Inventory
from gateway.placement.performance import Prediction

ChoiceRule = Literal["only_fit", "highest_precision", "fastest", "floor", "none_reach_floor"]
"""Which rule chose among the fits (docs/placement.md): the only fit; the highest precision among the fits
reaching the floor (objective quality); the fastest (objective speed); the most precise fit that reaches the
floor, more precise ones being too slow; the fastest, since no fit reaches the floor."""


class Rejection(NamedTuple):
    """A rung that was tried (or ruled out) and why; unpacks as `(rung, reason)`."""

    rung: str
    reason: str


class Alternative(BaseModel):
    """A placement that fits but was not chosen: what it is, how fast it was predicted, and why not."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rung: str
    option: str = Field(description="engine, precision, GPUs, context x sessions")
    precision: str = Field(default="", description="weights and KV cache, e.g. Q8_0 or float16, KV int8")
    prediction: Prediction
    why_not: str


class ChoiceReason(BaseModel):
    """Which rule chose the placement among the fits, and what the runner-up would give instead."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rule: ChoiceRule
    summary: str = Field(description="the rule, the chosen precision and speed, the runner-up's, in one sentence")
    precision: str = Field(description="of the chosen placement")
    runner_up: Alternative | None = Field(
        default=None, description="the fit the other objective (or, for a floor rule, the more precise fit) gives"
    )


class ModelDecision(BaseModel):
    """Where one model runs and why, or why it runs nowhere (`plan` None, `refusal` says what it would need)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    plan: DeploymentPlan | None = None
    rung: str | None = Field(default=None, description="the ladder rung that placed it")
    source: str | None = Field(default=None, description="the source chosen, described")
    estimate: MemoryEstimate | None = Field(default=None, description="of the chosen plan, or the closest miss")
    rejected: list[Rejection] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list, description="why the chosen plan looks the way it does")
    refusal: str | None = None
    objective: Objective = Field(default="quality", description="quality or speed among the fits (docs/placement.md)")
    speed_metric: SpeedMetric = Field(default="throughput", description="what faster means for this model")
    min_tok_s_per_stream: float = Field(
        default=DEFAULT_MIN_TOK_S_PER_STREAM, description="the useful-speed floor, tok/s per stream"
    )
    choice: ChoiceReason | None = Field(default=None, description="which rule chose the plan among the fits")
    prediction: Prediction | None = Field(default=None, description="predicted speed of the chosen plan")
    alternatives: list[Alternative] = Field(default_factory=list, description="fits that were not chosen")
    load: Literal["always", "on_demand"] = Field(default="always", description="the model's residency setting")
    residency: Literal["resident", "swaps"] | None = Field(
        default=None, description="resident: in memory from boot (pinned); swaps: loaded on demand, evictable"
    )
    co_resident: list[str] = Field(
        default_factory=list, description="on-demand models this one fits beside (two at once, beside the pinned set)"
    )


class ResidencySummary(BaseModel):
    """Memory per pool (`host`, `gpu<i>`) for on-demand models: the budget, what the pinned set holds
    (estimated), and what it leaves; `None` where the budget is not known."""

    model_config = ConfigDict(extra="forbid")

    budget_bytes: dict[str, int | None] = Field(default_factory=dict)
    pinned_bytes: dict[str, int] = Field(default_factory=dict)
    left_bytes: dict[str, int | None] = Field(default_factory=dict)


class PlacementReport(BaseModel):
    """Every model's decision in config order; `start_order` is the order workers must start in (and
    become ready in, one after another) when they share GPUs: TurboMind sizes its KV cache from the
    memory free when it starts."""

    model_config = ConfigDict(extra="forbid")

    inventory: Inventory
    decisions: list[ModelDecision]
    start_order: list[str] = Field(default_factory=list)
    residency: ResidencySummary | None = Field(default=None, description="memory left for on-demand models")

    @property
    def plans(self) -> list[DeploymentPlan]:
        """The placed models' plans, in start order."""
        placed = {d.model: d.plan for d in self.decisions if d.plan is not None}
        return [placed[name] for name in self.start_order if name in placed]

    def decision(self, model: str) -> ModelDecision:
        return next(d for d in self.decisions if d.model == model)


def _gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def _inventory_line(inventory: Inventory) -> str:
    if not inventory.gpus:
        why = f" ({inventory.note})" if inventory.note else ""
        return f"no GPUs{why}: models run on the CPU"
    parts = [gpu.describe() for gpu in inventory.gpus]
    kind = "simulated" if inventory.source == "simulated" else "NVML"
    unlinked = any(
        b.index not in a.nvlink_peers + a.switch_peers for a in inventory.gpus for b in inventory.gpus if a is not b
    )
    rest = "; pairs not listed: PCIe through the CPU" if unlinked else ""
    return f"{kind}: " + "; ".join(parts) + rest


def precision_label(plan: DeploymentPlan) -> str:
    """Weights and KV cache of a plan: `Q8_0`, `Q4_K_M, KV q8_0`, `float16`, `awq w4a16, KV int8`."""
    if plan.engine is EngineName.LMDEPLOY:
        weights = f"{plan.quant} w4a16" if plan.quant else plan.dtype
        kv = {0: "", 8: ", KV int8", 4: ", KV int4"}[plan.quant_policy]
        return weights + kv
    return (plan.quant or "gguf") + (", KV q8_0" if plan.kv_cache_type == "q8_0" else "")


def describe_plan(rung: str, plan: DeploymentPlan) -> str:
    """One line for a placement: rung, precision, where, context x sessions."""
    return f"{rung} {precision_label(plan)} on {_where(plan)}, {plan.context_tokens} x {plan.slots}"


def _where(plan: DeploymentPlan) -> str:
    if plan.engine is EngineName.LLAMACPP and plan.n_gpu_layers == 0:
        return "CPU"
    gpus = ",".join(map(str, plan.gpu_indices)) or "-"
    if plan.engine is EngineName.LLAMACPP and plan.n_gpu_layers > 0:
        return f"{gpus} ({plan.n_gpu_layers} layers)"
    return f"{gpus} (tp {plan.tp})" if plan.tp > 1 else gpus


def _memory(estimate: MemoryEstimate) -> Text:
    lines = [f"{name} {value:.2f}" for name, value in estimate.terms_gib.items() if value]
    lines += [f"on GPU {i}: {_gib(n)}" for i, n in sorted(estimate.gpu_bytes.items())]
    if estimate.host_bytes:
        lines.append(f"in host: {_gib(estimate.host_bytes)}")
    if estimate.prompt_cache_bytes:
        lines.append(f"prompt cache: up to {_gib(estimate.prompt_cache_bytes)}")
    return Text("\n".join(lines))


def _speed(prediction: Prediction | None) -> str:
    if prediction is None:
        return ""
    lines = [f"1 stream: {prediction.decode_tok_s_1:,.0f}"]
    if prediction.sessions > 1:
        lines.append(f"{prediction.sessions} streams: {prediction.aggregate_tok_s:,.0f}")
    if prediction.capacity_sessions > prediction.sessions:
        lines.append(f"{prediction.capacity_sessions} streams: {prediction.capacity_tok_s:,.0f}")
    lines.append(f"TTFT {prediction.ttft_s:.2f} s")
    if prediction.sessions > 1:
        lines.append(f"{prediction.sessions} at once: {prediction.ttft_burst_s:.2f} s")
    return "\n".join(lines)


def render_plan_table(report: PlacementReport, console: Console) -> None:
    """Print the plan: one row per model (engine and precision, source, GPUs and tp, context x sequences,
    memory by term in GiB, predicted tokens/s), then each model's rejected rungs, warnings, notes, predicted
    speed and the fits it was chosen over."""
    table = Table(title="voltgate placement", caption=_inventory_line(report.inventory), show_lines=True)
    for column in ("model", "engine", "source", "GPUs", "ctx x seqs", "memory (GiB)", "tok/s (predicted)"):
        table.add_column(column, overflow="fold", no_wrap=column in ("GPUs", "ctx x seqs"))
    for d in report.decisions:
        plan = d.plan
        name = Text(d.model) + (Text("\n(on demand)", style="cyan") if d.load == "on_demand" else Text(""))
        if plan is None:
            table.add_row(name, Text("refused", style="bold red"), "", "", "", "see below", "")
            continue
        engine = "TurboMind" if plan.engine is EngineName.LMDEPLOY else "llama.cpp"
        table.add_row(
            name,
            Text(engine, style="bold green") + Text("\n" + precision_label(plan)),
            plan.source_path.name,
            _where(plan),
            f"{plan.context_tokens} x {plan.slots}",
            _memory(d.estimate) if d.estimate else "",
            _speed(d.prediction),
        )
    console.print(table)
    for d in report.decisions:
        console.print(Text(d.model, style="bold"))
        for rung, reason in d.rejected:
            console.print(Text(f"  x {rung}: ", style="dim") + Text(reason, style="dim"))
        for warning in d.warnings:
            console.print(Text(f"  ! {warning}", style="yellow"))
        for note in d.notes:
            console.print(Text(f"  - {note}"))
        if d.prediction is not None:
            console.print(Text(f"  = predicted ({d.prediction.gpu}): {d.prediction.describe()}"))
            console.print(Text(f"    from: {d.prediction.inputs.explain()}", style="dim"))
            for note in d.prediction.notes:
                console.print(Text(f"    ({note})", style="dim"))
        if d.choice is not None:
            console.print(Text(f"  > rule {d.choice.rule}: {d.choice.summary}"))
        for alt in d.alternatives:
            line = f"  ~ also fits: {alt.option}: {alt.prediction.describe()}; not chosen: {alt.why_not}"
            console.print(Text(line, style="dim"))
        if d.refusal:
            console.print(Text(f"  refused: {d.refusal}", style="red"))
    pinned = [d.model for d in report.decisions if d.load == "always" and d.model in report.start_order]
    if len(pinned) > 1:
        console.print(Text("start order: " + " -> ".join(pinned), style="dim"))
    if any(d.load == "on_demand" for d in report.decisions):
        render_residency(report, console)


def render_residency(report: PlacementReport, console: Console) -> None:
    """Which models stay in memory, which are loaded on demand and beside which, which never can be."""
    summary = report.residency or ResidencySummary()
    parts = []
    for pool in sorted(summary.budget_bytes):
        budget, left = summary.budget_bytes[pool], summary.left_bytes.get(pool)
        label = "host" if pool == "host" else f"GPU {pool.removeprefix('gpu')}"
        if budget is None:
            parts.append(f"{label}: no budget known")
        else:
            held = summary.pinned_bytes.get(pool, 0)
            parts.append(f"{label} {_gib(budget)} GiB, pinned {_gib(held)}, left {_gib(left or 0)}")
    console.print(Text("residency (memory for on-demand models: " + "; ".join(parts) + ")", style="bold"))
    for d in report.decisions:
        if d.residency == "resident":
            line = "resident: loaded at start, never unloaded (load: always)"
        elif d.residency == "swaps":
            beside = ", ".join(d.co_resident) if d.co_resident else "no other on-demand model (one at a time)"
            line = f"swaps: loaded on demand, evicted when another needs the memory; fits beside {beside}"
        elif d.load == "on_demand":
            refusal = d.refusal or "not placed"
            line = refusal if refusal.startswith("can never") else f"can never be loaded: {refusal}"
        else:
            continue
        style = "red" if d.residency is None else None
        console.print(Text(f"  {d.model}: {line}", style=style or ""))
