"""`replicas: auto` (docs/replicas.md): how many replicas of a model, against one placement of it.

    resolve_replicas(config, inventory) ─▶ (config with each `auto` a number, {model: the note explaining it},
                                           the plan of that config: the winning trial's, planned once)

For a model with `replicas: auto` and `concurrency` c on G GPUs, each N from 1 to min(G, c) is planned with the
whole configuration (`plan_models`): N replicas of ceil(c / N) sessions each, against N = 1, which is the
placement the ladder chooses alone (tensor parallel over several GPUs where that is its choice). An N is a
candidate only if every replica is placed on GPUs and no other model's plan changes, and (N > 1) each replica
predicts at least the model's `min_tok_s_per_stream` per stream. Of the candidates, the fewest replicas whose
predicted tok/s in total at the model's sessions is within `GAIN` of the most wins: a near-tie keeps fewer
workers.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config import Config, ModelSpec
from gateway.config_replicas import expand, replica_name
from gateway.placement.inventory import Inventory
from gateway.placement.policy import plan_models
from gateway.placement.report import PlacementReport
from gateway.placement.rungs import LC_PARTIAL

GAIN = 1.05
"""A candidate within this factor of the best predicted total counts as a tie (the speed model's error)."""


@dataclass(frozen=True)
class Trial:
    replicas: int
    total_tok_s: float
    per_stream_tok_s: float
    sessions: int  # per replica


def resolve_replicas(config: Config, inventory: Inventory) -> tuple[Config, dict[str, str], PlacementReport | None]:
    """`config` with every `replicas: auto` set to the number chosen, and why, per model (see the module), with
    the plan of the returned config (the last choice's winning trial; None when no model says `auto`)."""
    notes: dict[str, str] = {}
    report: PlacementReport | None = None
    for spec in [m for m in config.models if m.replicas == "auto"]:
        config, notes[spec.name], report = _choose(config, spec, inventory)
    return config, notes, report


def _with(config: Config, spec: ModelSpec, replicas: int) -> Config:
    chosen = spec.model_copy(update={"replicas": replicas})  # `expand` splits the sessions among them
    models = tuple(chosen if m.name == spec.name else m for m in config.models)
    return config.model_copy(update={"models": expand(models)})


def _choose(config: Config, spec: ModelSpec, inventory: Inventory) -> tuple[Config, str, PlacementReport]:
    most = max(1, min(len(inventory.gpus), spec.concurrency))
    reports = {1: plan_models(_with(config, spec, 1), inventory)}
    trials: list[Trial] = []
    skipped: list[str] = []
    for n in range(1, most + 1):
        reports[n] = reports.get(n) or plan_models(_with(config, spec, n), inventory)
        trial = _trial(reports[n], reports[1], spec, n)
        if isinstance(trial, Trial):
            trials.append(trial)
        else:
            skipped.append(trial)
    if not trials:
        note = "replicas: auto -> 1 (no placement of one replica on GPUs to compare)"
        return _with(config, spec, 1), note, reports[1]
    floor = config.placement_for(spec).min_tok_s_per_stream
    eligible = [t for t in trials if t.replicas == 1 or t.per_stream_tok_s >= floor]
    top = max(t.total_tok_s for t in eligible)
    best = min((t for t in eligible if t.total_tok_s * GAIN >= top), key=lambda t: t.replicas)
    runner = max((t for t in trials if t is not best), key=lambda t: t.total_tok_s, default=None)
    note = f"replicas: auto -> {best.replicas}: {_said(best)}"
    if runner is not None:
        note += f"; runner-up {runner.replicas}: {_said(runner)}"
    if skipped:
        note += "; " + "; ".join(skipped)
    return _with(config, spec, best.replicas), note, reports[best.replicas]


def _trial(report: PlacementReport, base: PlacementReport, spec: ModelSpec, n: int) -> Trial | str:
    """N replicas' predicted speed, or why N is not a candidate."""
    names = [replica_name(spec.name, k) for k in range(1, n + 1)]
    decisions = [report.decision(name) for name in names]
    if any(d.plan is None or not d.plan.gpu_indices or d.rung == LC_PARTIAL or d.prediction is None for d in decisions):
        return f"{n} not wholly on GPUs"
    others = [d.model for d in base.decisions if d.model not in names]
    if any(report.decision(o).plan != base.decision(o).plan for o in others):
        return f"{n} would change another model's plan"
    predictions = [d.prediction for d in decisions if d.prediction is not None]
    return Trial(n, sum(p.aggregate_tok_s for p in predictions), min(p.decode_tok_s_per_stream for p in predictions),
                 predictions[0].sessions)  # fmt: skip


def _said(trial: Trial) -> str:
    return (f"{trial.total_tok_s:,.0f} tok/s in total predicted, {trial.per_stream_tok_s:,.1f} per stream "
            f"({trial.sessions} sessions a replica)")  # fmt: skip


def plan_with_replicas(config: Config, inventory: Inventory) -> tuple[Config, PlacementReport]:
    """`plan_models` after `resolve_replicas`: the configuration the plans are of (each `auto` a number, its
    replicas made) and the report, each `auto` model's decision noting the choice first."""
    config, notes, chosen = resolve_replicas(config, inventory)
    report = chosen or plan_models(config, inventory)
    for name, note in notes.items():
        report.decision(name).notes.insert(0, note)
    return config, report
