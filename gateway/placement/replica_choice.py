"""`replicas: auto` (docs/replicas.md): how many replicas of a model, against one placement of it.

    resolve_replicas(config, inventory) ─▶ (config with each `auto` a number, {model: the note explaining it},
                                           the plan of that config: the winning trial's, planned once)

For a model with `replicas: auto` and `concurrency` c on G GPUs, each N from 1 to min(G, c) is planned with the
whole configuration (`plan_models`): N replicas of ceil(c / N) sessions each, against N = 1, which is the
placement the ladder chooses alone (tensor parallel over several GPUs where that is its choice). An N is a
candidate only if every replica is placed on GPUs of its own and no other model's plan changes, and (N > 1) each replica
predicts at least the model's `min_tok_s_per_stream` per stream. Of the candidates, the fewest replicas whose
predicted tok/s in total at the model's sessions is within `GAIN` of the most wins: a near-tie keeps fewer
workers.

The choice is made against a `Planner`: how to plan a whole configuration and read a model's decision in that
plan. `resolve_replicas` / `plan_with_replicas` are one host's (`plan_models` on an inventory);
`gateway.cluster.plan.plan_cluster_with_replicas` is a cluster's (`plan_cluster` over its hosts), through
`resolve_with` / `plan_with`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from gateway.config import Config, ModelSpec
from gateway.config_replicas import MOST_REPLICAS, chosen_between, expand, replica_name
from gateway.placement.inventory import Inventory
from gateway.placement.policy import plan_models
from gateway.placement.report import ModelDecision, PlacementReport
from gateway.placement.rungs import LC_PARTIAL

GAIN = 1.05
"""A candidate within this factor of the best predicted total counts as a tie (the speed model's error)."""

R = TypeVar("R")  # a plan of a whole configuration: one host's `PlacementReport`, or a `ClusterReport`


@dataclass(frozen=True)
class Planner(Generic[R]):
    """What the choice needs of a planner: `plan` a whole configuration; a model's `decision` in that plan
    (None: not placed anywhere); `where` a model is in it (what must not change for another model: its plan,
    and in a cluster its host); the `gpus` a model's replicas may use (the most replicas tried)."""

    plan: Callable[[Config], R]
    decision: Callable[[R, str], ModelDecision | None]
    where: Callable[[R, str], Hashable]
    gpus: Callable[[ModelSpec], int]
    devices: Callable[[R, str], frozenset[Hashable]]  # the GPUs a model's plan uses (in a cluster: host and index)


@dataclass(frozen=True)
class Trial:
    replicas: int
    total_tok_s: float
    per_stream_tok_s: float
    sessions: int  # per replica


def one_host(inventory: Inventory) -> Planner[PlacementReport]:
    """The planner of one host: `plan_models` on `inventory`."""
    return Planner(
        plan=lambda config: plan_models(config, inventory),
        decision=lambda report, model: report.decision(model),
        where=lambda report, model: report.decision(model).plan,
        gpus=lambda _spec: len(inventory.gpus),
        devices=lambda report, model: frozenset(_indices(report.decision(model))),
    )


def _indices(decision: ModelDecision | None) -> tuple[int, ...]:
    return decision.plan.gpu_indices if decision is not None and decision.plan is not None else ()


def resolve_replicas(config: Config, inventory: Inventory) -> tuple[Config, dict[str, str], PlacementReport | None]:
    """`config` with every `replicas: auto` set to the number chosen, and why, per model (see the module), with
    the plan of the returned config (the last choice's winning trial; None when no model says `auto`)."""
    return resolve_with(config, one_host(inventory))


def plan_with_replicas(config: Config, inventory: Inventory) -> tuple[Config, PlacementReport]:
    """`plan_models` after `resolve_replicas`: the configuration the plans are of (each `auto` a number, its
    replicas made) and the report, each `auto` model's decision noting the choice first."""
    return plan_with(config, one_host(inventory))


def resolve_with(config: Config, planner: Planner[R]) -> tuple[Config, dict[str, str], R | None]:
    """`resolve_replicas` against any planner."""
    notes: dict[str, str] = {}
    report: R | None = None  # the last choice's plan
    for spec in config.models:
        between = chosen_between(spec.replicas)
        if between is None:
            continue
        lo, hi = between
        if lo == 1 and (spec.remote is not None or min(hi, planner.gpus(spec), spec.concurrency) <= 1):
            config = _with(config, spec, 1)  # nothing to compare (the default on one GPU): no plan, no note
            continue  # (a plan made before stays the plan: `auto` and 1 plan alike)
        config, notes[spec.name], chosen = _choose(config, spec, planner, lo, hi)
        report = chosen
    return config, notes, report


def plan_with(config: Config, planner: Planner[R]) -> tuple[Config, R]:
    """`plan_with_replicas` against any planner."""
    resolved = resolve_with(config, planner)  # (unpacked apart: mypy would solve R as `R | None` otherwise)
    config, notes, chosen = resolved
    report = planner.plan(config) if chosen is None else chosen
    for name, note in notes.items():
        decision = planner.decision(report, name)
        if decision is not None:
            decision.notes.insert(0, note)
    return config, report


def _with(config: Config, spec: ModelSpec, replicas: int) -> Config:
    chosen = spec.model_copy(update={"replicas": replicas})  # `expand` splits the sessions among them
    models = tuple(chosen if m.name == spec.name else m for m in config.models)
    return config.model_copy(update={"models": expand(models)})


def _choose(config: Config, spec: ModelSpec, planner: Planner[R], lo: int, hi: int) -> tuple[Config, str, R]:
    """N in `lo`..`hi` (within the GPUs and sessions, never under `lo`), against the one placement (N = 1)."""
    most = max(lo, min(hi, planner.gpus(spec), spec.concurrency))
    said = "auto" if (lo, hi) == (1, MOST_REPLICAS) else f"{lo}-{hi}"
    reports = {1: planner.plan(_with(config, spec, 1))}
    others = [m.name for m in config.models if m.name != spec.name]
    trials: list[Trial] = []
    skipped: list[str] = []
    for n in range(lo, most + 1):
        reports[n] = reports[n] if n in reports else planner.plan(_with(config, spec, n))
        trial = _trial(planner, reports[n], reports[1], spec, n, others)
        if isinstance(trial, Trial):
            trials.append(trial)
        else:
            skipped.append(trial)
    floor = config.placement_for(spec).min_tok_s_per_stream
    eligible = [t for t in trials if t.replicas == lo or t.per_stream_tok_s >= floor]
    if not eligible:
        note = f"replicas: {said} -> {lo} (no placement of {lo} replica(s) apart on GPUs to compare)"
        return _with(config, spec, lo), note + "".join(f"; {s}" for s in skipped), reports[lo]
    top = max(t.total_tok_s for t in eligible)
    best = min((t for t in eligible if t.total_tok_s * GAIN >= top), key=lambda t: t.replicas)
    runner = max((t for t in trials if t is not best), key=lambda t: t.total_tok_s, default=None)
    note = f"replicas: {said} -> {best.replicas}: {_said(best)}"
    if runner is not None:
        note += f"; runner-up {runner.replicas}: {_said(runner)}"
    if skipped:
        note += "; " + "; ".join(skipped)
    return _with(config, spec, best.replicas), note, reports[best.replicas]


def _trial(planner: Planner[R], report: R, base: R, spec: ModelSpec, n: int, others: list[str]) -> Trial | str:
    """N replicas' predicted speed, or why N is not a candidate (`others`: the other models of the config)."""
    decisions = [planner.decision(report, replica_name(spec.name, k)) for k in range(1, n + 1)]
    if any(d is None or d.plan is None or not d.plan.gpu_indices or d.rung == LC_PARTIAL or d.prediction is None
           for d in decisions):  # fmt: skip
        return f"{n} not wholly on GPUs"
    if any(planner.where(report, o) != planner.where(base, o) for o in others):
        return f"{n} would change another model's plan"
    used = [planner.devices(report, replica_name(spec.name, k)) for k in range(1, n + 1)]
    if len(frozenset().union(*used)) < sum(len(u) for u in used):  # the speed model counts each GPU's compute once
        return f"{n} would put replicas on the same GPU (they would divide its compute)"
    predictions = [d.prediction for d in decisions if d is not None and d.prediction is not None]
    return Trial(n, sum(p.aggregate_tok_s for p in predictions), min(p.decode_tok_s_per_stream for p in predictions),
                 predictions[0].sessions)  # fmt: skip


def _said(trial: Trial) -> str:
    return (f"{trial.total_tok_s:,.0f} tok/s in total predicted, {trial.per_stream_tok_s:,.1f} per stream "
            f"({trial.sessions} sessions a replica)")  # fmt: skip
