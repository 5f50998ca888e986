"""The placement policy: each model climbs the ladder (docs/hardware.md, "Placement"); models pack largest first.

Pass 1 gives every model, largest first, a placement wholly on GPUs: the tiered ladder of
`gateway.placement.ladder` (the targets with full-precision KV, then quantized KV, then fewer sessions, then
a shorter session where `min_context` allows), choosing within a tier by the useful-speed floor and the
model's `objective` (`gateway.placement.choice`). Pass 2 gives what is left to the models still unplaced:
llama.cpp partial offload (its predicted slowness in the plan), then the CPU. Embedding and rerank models then
take what is left, a GPU with room or the CPU (`gateway.placement.embedding`). Pass 3 turns spare memory on
GPUs that a TurboMind worker has to itself into more KV cache. A model that fits nowhere is refused with the
closest rung's shortfall and what would make it fit (`gateway.placement.hints`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from backends.base import DeploymentPlan, EngineName
from backends.llamacpp.cpu_features import physical_cores
from gateway.config import Config, GGUFSource, HFSource, ModelSpec, PlacementSettings
from gateway.config_replicas import model_of, replica_of
from gateway.placement.choice import predict_placed
from gateway.placement.embedding import Task, place_pooled, serving_task
from gateway.placement.estimate import MARGIN_BYTES
from gateway.placement.experts import try_llamacpp_offload
from gateway.placement.hints import refusal_hints
from gateway.placement.host_cache import with_prompt_cache
from gateway.placement.inspection import InspectionError, SourceInfo, inspect_source
from gateway.placement.inventory import GPU, Inventory, host_budget_bytes
from gateway.placement.ladder import Option, RuledOut, climb, llamacpp_options, turbomind_options
from gateway.placement.performance import Prediction
from gateway.placement.report import Alternative, ChoiceReason, ModelDecision, PlacementReport, Rejection
from gateway.placement.rungs import (
    LC_CPU,
    LC_GPU,
    LC_PARTIAL,
    TM_FP16,
    TM_W4A16,
    Miss,
    ModelWork,
    Placed,
    try_llamacpp_cpu,
)
from gateway.placement.swapping import plan_residency

SIMULATED_HOST_THREADS = 8
"""llama.cpp threads a simulated layout's host is taken to give the CPU layers (an 8-core host with 16
hardware threads; the worker uses one thread per physical core, `cpu_features.physical_cores`)."""

Attempt = Callable[[int], "Placed | Miss | list[Miss]"]


@dataclass
class _Entry:
    spec: ModelSpec
    work: ModelWork | None = None
    misses: list[Miss] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    placed: Placed | None = None
    refusal: str | None = None
    no_turbomind: bool = False
    no_llamacpp: bool = False
    gpu_note: str | None = None
    notes: list[str] = field(default_factory=list)
    alternatives: list[Alternative] = field(default_factory=list)
    reason: ChoiceReason | None = None
    prediction: Prediction | None = None
    settings: PlacementSettings = field(default_factory=PlacementSettings)

    @property
    def size(self) -> int:
        if self.work is None:
            return 0
        return max((s.weights_bytes for s in (*self.work.fp16, *self.work.w4a16, *self.work.ggufs)), default=0)


def plan_models(config: Config, inventory: Inventory) -> PlacementReport:
    """Place every configured model on `inventory`. Never raises for a model that does not fit or whose
    source is missing: its decision records the refusal and every rejected rung.

    Pinned models (`load: always`) are placed together; each on-demand model is placed on its own against
    what the pinned set leaves (`gateway.placement.swapping` then says which can share memory)."""
    ledger = {gpu.index: max(0, gpu.free_bytes - MARGIN_BYTES) for gpu in inventory.gpus}
    tasks = {spec.name: serving_task(spec, config.base_dir) for spec in config.models if spec.remote is None}
    pinned = [spec for spec in config.models if spec.load == "always"]
    entries = [_prepare(spec, config, inventory) for spec in pinned if tasks.get(spec.name) == "generate"]
    order = sorted((e for e in entries if e.work is not None), key=lambda e: -e.size)
    start_order: list[_Entry] = []
    for whole in (True, False):
        for entry in order:
            if entry.placed is None:
                placed = _climb_apart(entry, ledger, start_order, whole=whole)
                if placed is not None:
                    entry.placed = placed
                    start_order.append(entry)
                    for index, used in placed.estimate.gpu_bytes.items():
                        ledger[index] -= used
    pooled = [
        _pooled(spec, task, config, inventory, ledger)
        for spec in pinned
        if (task := tasks.get(spec.name, "generate")) != "generate"
    ]
    start_order += [e for e in pooled if e.placed is not None]  # after the generation models they fit around
    left = dict(ledger)  # what the pinned set leaves: each on-demand model is placed on it alone
    swapped = [_place_alone(spec, tasks.get(spec.name, "generate"), config, inventory, left)
               for spec in config.models if spec.load == "on_demand"]  # fmt: skip
    _grow_kv(start_order, ledger, [e for e in swapped if e.placed is not None])
    for entry in order:
        if entry.placed is None:
            entry.refusal = _refusal(entry, ledger)
        elif entry.work is not None:
            entry.prediction = predict_placed(entry.work, entry.placed)
    local = {e.spec.name: _decision(e) for e in (*entries, *pooled, *swapped)}
    remote = {spec.name: _remote_decision(spec) for spec in config.models if spec.remote is not None}
    report = PlacementReport(
        inventory=inventory,
        decisions=[local.get(spec.name) or remote[spec.name] for spec in config.models],
        start_order=[*remote, *(e.spec.name for e in start_order), *(e.spec.name for e in swapped if e.placed)],
    )
    return plan_residency(report, config.models, host_budget_bytes(config.server.memory_budget_bytes), left)


def _place_alone(spec: ModelSpec, task: Task, config: Config, inventory: Inventory, left: dict[int, int]) -> _Entry:
    """An on-demand model on what the pinned set leaves, as if no other on-demand model were loaded."""
    if task != "generate":
        return _pooled(spec, task, config, inventory, dict(left))
    entry = _prepare(spec, config, inventory)
    if entry.work is None:
        return entry
    ledger = dict(left)
    for whole in (True, False):
        entry.placed = _climb(entry, ledger, whole=whole)
        if entry.placed is not None:
            entry.prediction = predict_placed(entry.work, entry.placed)
            return entry
    entry.refusal = _refusal(entry, ledger)
    return entry


def _pooled(spec: ModelSpec, task: Task, config: Config, inventory: Inventory, ledger: dict[int, int]) -> _Entry:
    """An embed/rerank model on what the generation models left (`gateway.placement.embedding`), booked."""
    outcome = place_pooled(spec, task, config.base_dir, inventory, ledger)
    entry = _Entry(spec, misses=outcome.misses, warnings=outcome.warnings, placed=outcome.placed,
                   refusal=outcome.refusal)  # fmt: skip
    for index, used in outcome.placed.estimate.gpu_bytes.items() if outcome.placed else ():
        ledger[index] -= used
    return entry


def _remote_decision(spec: ModelSpec) -> ModelDecision:
    """A model served by an endpoint on another host: no local memory, nothing to choose."""
    source = spec.remote
    assert source is not None
    plan = DeploymentPlan(
        model=spec.name,
        engine=EngineName.REMOTE,
        source_path=Path(source.remote),
        model_format="remote",
        dtype="auto",
        context_tokens=spec.context,
        slots=spec.concurrency,
        remote_url=source.root_url,
        remote_model=source.model or spec.name,
    )
    return ModelDecision(
        model=spec.name,
        plan=plan,
        rung="remote",
        source=source.remote,
        notes=[f"served by {source.remote} (model {plan.remote_model!r}); {spec.concurrency} request(s) at once"],
    )


def _prepare(spec: ModelSpec, config: Config, inventory: Inventory) -> _Entry:
    """Inspect the sources, apply the overrides that remove whole engines or sources."""
    entry = _Entry(spec, gpu_note=inventory.note, settings=config.placement_for(spec))
    infos: list[SourceInfo] = []
    for source in spec.sources:
        location = source.gguf if isinstance(source, GGUFSource) else source.hf if isinstance(source, HFSource) else ""
        try:
            info = inspect_source(source, config.base_dir)
        except InspectionError as exc:
            entry.misses.append(Miss("source", f"{location}: {exc}"))
            continue
        infos.append(info)
        entry.warnings.extend(w for w in info.warnings if w not in entry.warnings)
    if not infos:
        entry.refusal = "no usable source: " + "; ".join(m.reason for m in entry.misses)
        return entry
    fp16 = [s for s in infos if s.format == "hf"]
    w4a16 = [s for s in infos if s.format in ("awq", "gptq")]
    ggufs = sorted((s for s in infos if s.format == "gguf"), key=lambda s: -s.bits_per_weight)
    trained = infos[0].shape.max_context
    if trained and spec.context > trained:
        entry.warnings.append(f"context {spec.context} is beyond the {trained} tokens the model was trained on")

    if spec.quant:
        wanted = spec.quant.lower()
        if wanted in ("awq", "gptq"):
            fp16, ggufs, w4a16 = [], [], [s for s in w4a16 if s.format == wanted]
            entry.no_llamacpp = True
        else:
            fp16, w4a16, ggufs = [], [], [s for s in ggufs if (s.quant or "").lower() == wanted]
            entry.no_turbomind = True
        if not (fp16 or w4a16 or ggufs):
            have = ", ".join(sorted({s.quant or s.format for s in infos}))
            entry.refusal = f"quant: {spec.quant} in the config matches no source (have: {have})"
            return entry
        entry.misses.append(Miss("override", f"quant: {spec.quant} in the config: only that source is considered"))
    if spec.engine == "lmdeploy" or spec.tp is not None:
        why = "engine: lmdeploy" if spec.engine == "lmdeploy" else f"tp: {spec.tp} (a TurboMind setting)"
        entry.misses.append(Miss("llamacpp", f"{why} in the config"))
        entry.no_llamacpp, ggufs = True, []
    if spec.engine == "llamacpp":
        entry.misses.append(Miss("turbomind", "engine: llamacpp in the config"))
        entry.no_turbomind, fp16, w4a16 = True, [], []
    if not (fp16 or w4a16 or ggufs):
        entry.refusal = _nothing_left(spec, infos)
        return entry

    gpus = _configured_gpus(entry, inventory)
    if gpus is None:
        return entry
    threads = SIMULATED_HOST_THREADS if inventory.source == "simulated" else physical_cores()  # the worker's
    entry.work = ModelWork(spec, fp16, w4a16, ggufs, gpus, inventory.host_memory_bytes, threads, entry.settings,
                           config.base_dir)  # fmt: skip
    return entry


def _configured_gpus(entry: _Entry, inventory: Inventory) -> dict[int, GPU] | None:
    """The GPUs the model may use (the `gpus:` override, checked), or None with the refusal recorded."""
    spec = entry.spec
    gpus = {g.index: g for g in inventory.gpus}
    if spec.gpus is None:
        return gpus
    missing = [i for i in spec.gpus if i not in gpus]
    if missing:
        entry.refusal = f"gpus: {list(spec.gpus)} in the config, but GPU {missing} is not in the inventory " + (
            f"(it has {', '.join(map(str, gpus))})" if gpus else "(it has no GPUs)"
        )
        return None
    if spec.tp is not None and spec.tp != len(spec.gpus):
        entry.refusal = f"tp: {spec.tp} but gpus: {list(spec.gpus)} lists {len(spec.gpus)} GPU(s)"
        return None
    return {i: gpus[i] for i in spec.gpus}


def _nothing_left(spec: ModelSpec, infos: list[SourceInfo]) -> str:
    """The refusal when the overrides rule out every source there is."""
    have = ", ".join(f"{s.path.name} ({s.quant or s.format})" for s in infos)
    if spec.quant is not None:
        engine = f"engine: {spec.engine}" if spec.engine != "auto" else f"tp: {spec.tp}"
        return f"quant: {spec.quant} and {engine} in the config rule out every source (have: {have})"
    if spec.engine == "llamacpp":
        return f"engine: llamacpp in the config, but no source is a GGUF file (have: {have}); add a GGUF source"
    why = "engine: lmdeploy" if spec.engine == "lmdeploy" else f"tp: {spec.tp}"
    return (
        f"{why} in the config means TurboMind, but no source is an HF directory (have: {have}); "
        "add an HF float16, AWQ or GPTQ source"
    )


def _climb(entry: _Entry, ledger: dict[int, int], *, whole: bool) -> Placed | None:
    work = entry.work
    assert work is not None
    spec = work.spec
    budgets = {i: ledger[i] for i in work.gpus}
    slots = spec.llamacpp.slots or spec.concurrency
    if not whole:
        placed = _first(entry, _fallback_rungs(entry, budgets, slots), spec.context)
        if placed is not None and placed.rung == LC_PARTIAL:
            entry.warnings.append(_partial_warning(work, placed))
        return None if placed is None else with_prompt_cache(work, placed)
    if not budgets:
        why = f" ({entry.gpu_note})" if entry.gpu_note else ""
        entry.misses.append(Miss("gpu", f"no GPUs in the inventory{why}"))
        return None
    choice = climb(work, budgets, _tiers(entry, budgets, slots))
    entry.misses.extend(choice.misses)
    entry.warnings.extend(w for w in choice.warnings if w not in entry.warnings)
    entry.notes, entry.alternatives, entry.reason = choice.notes, choice.alternatives, choice.reason
    return None if choice.placed is None else with_prompt_cache(work, choice.placed)


def _climb_apart(entry: _Entry, ledger: dict[int, int], placed: list[_Entry], *, whole: bool) -> Placed | None:
    """`_climb`, but a replica (`m@2`, config `replicas`) first tries the GPUs its model's placed replicas do not
    use: two replicas on one GPU share its compute and gain little. Where they do not fit apart, they share."""
    model = replica_of(entry.spec.name)
    siblings = [e for e in placed if model is not None and model_of(e.spec.name) == model]
    taken = {i for e in siblings if e.placed is not None for i in e.placed.estimate.gpu_bytes}
    if model is None or not whole or not taken:
        return _climb(entry, ledger, whole=whole)
    if set(ledger) - taken:
        misses, warnings = list(entry.misses), list(entry.warnings)
        apart = _climb(entry, {i: (0 if i in taken else room) for i, room in ledger.items()}, whole=True)
        if apart is not None:
            return apart
        entry.misses[:] = misses  # the apart attempt's misses, against GPUs zeroed on purpose, would mislead
        entry.warnings[:] = warnings
    shared = _climb(entry, ledger, whole=True)
    if shared is not None:
        together = ", ".join(str(i) for i in sorted(taken & set(shared.estimate.gpu_bytes)))
        entry.warnings.append(f"no placement apart from {model}'s other replicas fits: shares GPU {together} "
                              "with them (they divide its compute)")  # fmt: skip
    return shared


def _tiers(entry: _Entry, budgets: dict[int, int], slots: int) -> tuple[list[Option], list[Option]]:
    """Tier 1 and tier 2 of the ladder, in ladder order, with what the sources and overrides rule out."""
    work = entry.work
    assert work is not None
    spec = work.spec
    single = spec.tp in (None, 1) and (spec.gpus is None or len(spec.gpus) == 1)
    tps = ([1] if single else []) + _tps(spec, budgets)
    first: list[Option] = []
    second: list[Option] = []
    for w4a16, rung, missing in ((False, TM_FP16, "no HF float16 source"), (True, TM_W4A16, "no AWQ/GPTQ source")):
        if not (work.w4a16 if w4a16 else work.fp16):
            first += [] if entry.no_turbomind else [RuledOut(rung, missing)]
            continue
        tier1, tier2 = turbomind_options(work, budgets, tps, w4a16=w4a16)
        first, second = first + tier1, second + tier2
    forced = spec.llamacpp.n_gpu_layers
    if not work.ggufs:
        first += [] if entry.no_llamacpp else [RuledOut("llamacpp", "no GGUF source")]
    elif forced is not None and 0 <= forced <= min(s.shape.n_layers for s in work.ggufs):
        first.append(RuledOut(LC_GPU, f"n_gpu_layers: {forced} in the config"))
    else:
        tier1, tier2 = llamacpp_options(work, budgets, slots)
        first, second = first + tier1, second + tier2
        if not spec.llamacpp.flash_attn:
            second.append(RuledOut(LC_GPU, "KV q8_0 needs flash attention (llamacpp.flash_attn: false in the config)"))
    return first, second


def _partial_warning(work: ModelWork, placed: Placed) -> str:
    speed = predict_placed(work, placed)
    layers = f"{placed.plan.n_gpu_layers} of {placed.source.shape.n_layers} layers"
    total = f"{speed.decode_tok_s_1:,.1f} tok/s for one stream"
    if speed.sessions > 1:
        total += f", {speed.aggregate_tok_s:,.1f} tok/s in total for {speed.sessions} sessions"
    return (
        f"partial offload: only {layers} fit on the GPU and the rest read host memory every token, predicted "
        f"{total}; nothing kept every layer on a GPU (see the rejections)"
    )


def _fallback_rungs(entry: _Entry, budgets: dict[int, int], slots: int) -> list[tuple[str, Attempt]]:
    work = entry.work
    assert work is not None
    if not work.ggufs:
        return []
    forced = work.spec.llamacpp.n_gpu_layers
    rungs: list[tuple[str, Attempt]] = []
    if forced == -1:
        entry.misses.append(Miss(LC_PARTIAL, "n_gpu_layers: -1 in the config (all layers or nothing)"))
    elif forced == 0:
        entry.misses.append(Miss(LC_PARTIAL, "n_gpu_layers: 0 in the config"))
    elif budgets:
        rungs.append((LC_PARTIAL, lambda s: try_llamacpp_offload(work, budgets, s, slots)))
    if forced not in (None, 0):
        entry.misses.append(Miss(LC_CPU, f"n_gpu_layers: {forced} in the config"))
    elif work.spec.gpus is not None:
        entry.misses.append(Miss(LC_CPU, f"gpus: {list(work.spec.gpus)} in the config"))
    else:
        rungs.append((LC_CPU, lambda s: try_llamacpp_cpu(work, s, slots)))
    return rungs


def _tps(spec: ModelSpec, budgets: dict[int, int]) -> list[int]:
    """Tensor-parallel sizes to try: the configured tp, else all the configured GPUs, else 2, 4, 8."""
    if spec.tp is not None:
        return [spec.tp] if spec.tp > 1 else []
    if spec.gpus is not None:
        return [len(spec.gpus)] if len(spec.gpus) > 1 else []
    return [tp for tp in (2, 4, 8) if tp <= len(budgets)]


def _first(entry: _Entry, rungs: list[tuple[str, Attempt]], session: int) -> Placed | None:
    for _rung, attempt in rungs:
        result = attempt(session)
        if isinstance(result, Placed):
            entry.misses.extend(result.skipped)
            return result
        entry.misses.extend(result if isinstance(result, list) else [result])
    return None


def _grow_kv(started: list[_Entry], ledger: dict[int, int], on_demand: list[_Entry]) -> None:
    """Spare memory becomes KV cache for pinned TurboMind workers alone on their GPUs (shared GPUs, also
    with an on-demand model, keep it free)."""
    users: dict[int, int] = {}
    for entry in (*started, *on_demand):
        assert entry.placed is not None
        for index in entry.placed.estimate.gpu_bytes:
            users[index] = users.get(index, 0) + 1
    for entry in started:
        placed = entry.placed
        assert placed is not None
        if placed.regrow is None:
            continue
        mine = placed.estimate.gpu_bytes
        if any(users[i] > 1 for i in mine):
            entry.warnings.append("GPU shared with another model: the KV cache is kept to the target")
            continue
        grown = placed.regrow({i: ledger[i] + used for i, used in mine.items()})
        if grown is not None:
            for index, used in mine.items():
                ledger[index] += used - grown.estimate.gpu_bytes[index]
            entry.placed = grown


def _refusal(entry: _Entry, ledger: dict[int, int]) -> str:
    sized = [m for m in entry.misses if m.shortfall is not None]
    hints: list[str] = []
    if entry.work is not None:
        budgets = {i: ledger[i] for i in entry.work.gpus}
        hints = refusal_hints(entry.work, budgets, no_llamacpp=entry.no_llamacpp)
    would = ("; would fit with: " + "; ".join(hints)) if hints else ""
    if not sized:
        return "no rung applies: " + "; ".join(f"{m.rung}: {m.reason}" for m in entry.misses) + would
    closest = min(sized, key=lambda m: m.shortfall.gib if m.shortfall else 0.0)
    assert closest.shortfall is not None
    return (
        f"fits nowhere: short by {closest.shortfall.gib:.1f} GiB on the closest option, "
        f"{closest.rung} ({closest.reason}){would}"
    )


def reasoning_notes(spec: ModelSpec, plan: DeploymentPlan, prediction: Prediction | None) -> list[str]:
    """What the model's reasoning default (config `reasoning`) means for its speed: the thinking tokens before
    the first answer token and when that token comes (one stream), or that nothing bounds them; that TurboMind
    does not enforce a budget. None for a model with no default (docs/reasoning.md)."""
    default = spec.reasoning
    if default.effort is None and default.budget_tokens is None:
        return []
    thinking = default.thinking_tokens()
    if thinking == 0:
        return ["reasoning: thinking off by default; the first token is the answer's"]
    if thinking is None:
        return [f"reasoning: effort {default.effort} bounds no thinking; the first answer token waits for all of it"]
    notes = [f"reasoning: up to {thinking} thinking tokens before the answer"]
    if prediction is not None:
        notes[0] += f": first answer token after {prediction.answer_after_s(thinking):.2f} s (1 stream)"
    if plan.engine is EngineName.LMDEPLOY:
        notes.append("reasoning: TurboMind has no thinking budget; the model thinks as long as it wants")
    return notes


def _decision(entry: _Entry) -> ModelDecision:
    rejected = [Rejection(m.rung, m.reason) for m in entry.misses]
    placed = entry.placed
    if placed is None:
        return ModelDecision(
            model=entry.spec.name,
            rejected=rejected,
            warnings=entry.warnings,
            refusal=entry.refusal or "not placed",
            objective=entry.settings.objective,
            speed_metric=entry.settings.speed_metric,
            min_tok_s_per_stream=entry.settings.min_tok_s_per_stream,
            load=entry.spec.load,
        )
    return ModelDecision(
        model=entry.spec.name,
        plan=placed.plan,
        rung=placed.rung,
        source=placed.source.describe(),
        estimate=placed.estimate,
        rejected=rejected,
        warnings=[*entry.warnings, *(w for w in placed.warnings if w not in entry.warnings)],
        notes=[*entry.notes, *placed.notes, *reasoning_notes(entry.spec, placed.plan, entry.prediction)],
        objective=entry.settings.objective,
        speed_metric=entry.settings.speed_metric,
        min_tok_s_per_stream=entry.settings.min_tok_s_per_stream,
        choice=entry.reason,
        prediction=entry.prediction,
        alternatives=entry.alternatives,
        load=entry.spec.load,
    )
