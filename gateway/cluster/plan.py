"""One plan over every host of a cluster: the per-host policy (`gateway.placement.plan_models`) run host by host.

A model runs on exactly one host (tensor parallelism never crosses a host: each host is planned on its own
GPUs alone). Hosts are tried biggest first (GPU memory, then GPU count, then name), in two rounds:

1. every host, in turn, is offered the models not placed yet that may run there (`hosts:` in the config,
   and the host has a file of the model); a model is taken by the first host that places it wholly on GPUs;
2. the models still unplaced are offered again, one at a time, and taken by the first host that places them
   at all (llama.cpp partial offload, or the CPU) without moving a model it already holds.

Each host is planned with its own host-memory budget for on-demand models: `server.memory_budget_bytes`
where set (per host), else 80 % of the MemAvailable its agent reported when it joined (a host of a cluster
file, which reports none, gets the gateway's own).

Each host is then planned once more with exactly the models it took: that per-host `PlacementReport`
(memory, rejected rungs, predicted speed on that host's GPUs) is what `voltgate plan --cluster` shows, and
each model's `ClusterDecision.considered` says, per host, why it went there or not.

`plan_cluster_with_replicas` resolves each `replicas: auto` first, as one host does
(`gateway.placement.replica_choice`), with `plan_cluster` as the planner: N from 1 to the GPUs of the hosts
the model may run on, each N planned over the whole cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from backends.base import DeploymentPlan, EngineName
from gateway.cluster.hosts import HostView
from gateway.config import Config, ModelSpec
from gateway.config_replicas import model_of
from gateway.placement.inventory import HOST_BUDGET_FRACTION, Inventory, host_budget_bytes
from gateway.placement.policy import plan_models
from gateway.placement.replica_choice import Planner, plan_with
from gateway.placement.report import ModelDecision, PlacementReport


class HostPlacement(BaseModel):
    """One host's share of the plan: its inventory and the report of the models it took."""

    model_config = ConfigDict(extra="forbid")

    host: str
    address: str | None = None
    memory_budget_bytes: int | None = Field(
        default=None, description="the host memory its on-demand models may hold (the plan's fit check)"
    )
    report: PlacementReport


class HostConsidered(BaseModel):
    """What one host answered for one model: `placed` (wholly on GPUs, or partly / on the CPU) or why not."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str
    outcome: str


class ClusterDecision(BaseModel):
    """Where one model runs in the cluster: its host (None: refused, or a remote endpoint the gateway reaches
    itself), the decision of that host's plan, and what every host answered."""

    model_config = ConfigDict(extra="forbid")

    model: str
    host: str | None = None
    decision: ModelDecision
    considered: list[HostConsidered] = Field(default_factory=list)


class ClusterReport(BaseModel):
    """The cluster plan: one `HostPlacement` per host (biggest first), one `ClusterDecision` per model
    (config order)."""

    model_config = ConfigDict(extra="forbid")

    hosts: list[HostPlacement]
    decisions: list[ClusterDecision]

    def decision(self, model: str) -> ClusterDecision:
        return next(d for d in self.decisions if d.model == model)

    def host_of(self, model: str) -> str | None:
        return self.decision(model).host

    def plans_by_host(self) -> dict[str, list[DeploymentPlan]]:
        """Each host's plans in the order its workers must start."""
        return {h.host: h.report.plans for h in self.hosts}

    @property
    def placed(self) -> bool:
        return any(d.decision.plan is not None for d in self.decisions)


def plan_cluster(config: Config, hosts: Sequence[HostView]) -> ClusterReport:
    """Place every configured model on one host of `hosts`. Never raises for a model that fits nowhere: its
    decision carries the refusal of the host that came closest and what each host answered."""
    order = sorted(hosts, key=_host_size, reverse=True)
    local = [spec for spec in config.models if spec.remote is None]
    taken: dict[str, list[ModelSpec]] = {h.name: [] for h in order}
    considered: dict[str, list[HostConsidered]] = {spec.name: [] for spec in local}
    last: dict[str, ModelDecision] = {}
    known = {h.name for h in order}
    for host in order:  # round 1: wholly on GPUs, the first host that can (a model's replicas: its share)
        offered = _shares([s for s in local if _host_of(s.name, taken) is None and _allowed(s, host, considered)],
                          host, taken, config, order)  # fmt: skip
        report = plan_models(_subset(config, offered, host), host.inventory)
        for spec in offered:
            decision = report.decision(spec.name)
            last[spec.name] = decision
            if decision.plan is not None and _on_gpus(decision.plan):
                taken[host.name].append(spec)
                considered[spec.name].append(HostConsidered(host=host.name, outcome="placed wholly on GPUs"))
            else:  # said, so every host tried is listed, not only the one that took it
                why = decision.refusal or f"its best fit there is {decision.rung}"
                considered[spec.name].append(HostConsidered(host=host.name, outcome=f"not wholly on GPUs: {why}"))
    for spec in local:  # round 2: anywhere at all, one model at a time, never moving what a host holds
        if _host_of(spec.name, taken) is None:  # a replica tries the hosts with fewest of its model's first
            held = {h.name: _siblings(spec, taken[h.name]) for h in order}
            hosts_in_turn = sorted(order, key=lambda h: held[h.name])
            _offer_anywhere(config, spec, hosts_in_turn, taken, considered, last)
    placements = [_host_placement(config, host, taken[host.name]) for host in order]
    by_model = {d.model: (p.host, d) for p in placements for d in p.report.decisions}
    remote = plan_models(_subset(config, [s for s in config.models if s.remote is not None]), Inventory())
    decisions = []
    for spec in config.models:
        if spec.remote is not None:
            decisions.append(ClusterDecision(model=spec.name, decision=remote.decision(spec.name)))
        elif spec.name in by_model:
            host_name, decision = by_model[spec.name]
            decisions.append(ClusterDecision(model=spec.name, host=host_name, decision=decision,
                                             considered=considered[spec.name]))  # fmt: skip
        else:
            decisions.append(_refused(spec, last.get(spec.name), considered[spec.name], known))
    return ClusterReport(hosts=placements, decisions=decisions)


def plan_cluster_with_replicas(config: Config, hosts: Sequence[HostView]) -> tuple[Config, ClusterReport]:
    """`plan_cluster` after each `replicas: auto` is resolved over `hosts` (docs/replicas.md): the configuration
    the plan is of (each `auto` a number, its replicas made) and the plan, each `auto` model's decision noting
    the choice first. A candidate N must have every replica placed wholly on GPUs of some host and leave every
    other model on the same host with the same plan."""
    planner: Planner[ClusterReport] = Planner(
        plan=lambda c: plan_cluster(c, hosts),
        decision=lambda report, model: report.decision(model).decision,
        where=lambda report, model: (report.host_of(model), report.decision(model).decision.plan),
        gpus=lambda spec: sum(len(h.inventory.gpus) for h in hosts if _allowed(spec, h, None)),
        devices=lambda report, model: frozenset((report.host_of(model), i) for i in _indices(report, model)),
    )
    return plan_with(config, planner)


def _offer_anywhere(
    config: Config,
    spec: ModelSpec,
    order: Sequence[HostView],
    taken: dict[str, list[ModelSpec]],
    considered: dict[str, list[HostConsidered]],
    last: dict[str, ModelDecision],
) -> None:
    for host in order:
        if not _allowed(spec, host, None):
            continue
        held = taken[host.name]
        before = plan_models(_subset(config, held, host), host.inventory) if held else None
        report = plan_models(_subset(config, [*held, spec], host), host.inventory)
        decision = report.decision(spec.name)
        if decision.plan is None:
            last[spec.name] = decision
            outcome = f"refused: {decision.refusal}" if decision.refusal else "refused"
            considered[spec.name].append(HostConsidered(host=host.name, outcome=outcome))
            continue
        if before is not None and _moves(before, report, held):
            considered[spec.name].append(
                HostConsidered(host=host.name, outcome="fits only by moving a model this host already holds")
            )
            continue
        taken[host.name].append(spec)
        where = "partly on GPUs" if decision.plan.gpu_indices else "on the CPU"
        considered[spec.name].append(HostConsidered(host=host.name, outcome=f"placed {where}"))
        return


def _shares(
    offered: list[ModelSpec], host: HostView, taken: dict[str, list[ModelSpec]], config: Config,
    hosts: Sequence[HostView],
) -> list[ModelSpec]:  # fmt: skip
    """`offered` less the replicas (config `replicas`) past their model's share of `host`: N replicas over H
    hosts they may run on, at most ceil(N / H) a host in round 1, so losing a host loses only its share."""
    out: list[ModelSpec] = []
    for spec in offered:
        base = next((m for m in config.models if m.name == model_of(spec.name)), spec)
        allowed = [h for h in hosts if base.hosts is None or h.name in base.hosts] or list(hosts)
        replicas = base.replicas if isinstance(base.replicas, int) else 1  # `auto`: plan_cluster_with_replicas
        if _siblings(spec, [*taken[host.name], *out]) < -(-replicas // len(allowed)):
            out.append(spec)
    return out


def _siblings(spec: ModelSpec, held: Iterable[ModelSpec]) -> int:
    """How many of `spec`'s model's replicas (itself included) are in `held`."""
    return sum(1 for s in held if model_of(s.name) == model_of(spec.name))


def _moves(before: PlacementReport, after: PlacementReport, held: Iterable[ModelSpec]) -> bool:
    """True when adding a model changes the plan of one a host already holds."""
    return any(before.decision(s.name).plan != after.decision(s.name).plan for s in held)


def _allowed(spec: ModelSpec, host: HostView, considered: dict[str, list[HostConsidered]] | None) -> bool:
    """May `spec` run on `host`? Records why not (once, in round 1) when it may not."""
    why = None
    if spec.hosts is not None and host.name not in spec.hosts:
        why = f"not in the model's hosts ({', '.join(spec.hosts)})"
    elif spec.name in host.missing:
        why = "has no file of this model"
    if why is not None and considered is not None:
        considered[spec.name].append(HostConsidered(host=host.name, outcome=why))
    return why is None


def _on_gpus(plan: DeploymentPlan) -> bool:
    if not plan.gpu_indices:
        return False
    return plan.engine is EngineName.LMDEPLOY or plan.n_gpu_layers == -1 or plan.task != "generate"


def _indices(report: ClusterReport, model: str) -> tuple[int, ...]:
    plan = report.decision(model).decision.plan
    return plan.gpu_indices if plan is not None else ()


def _host_of(model: str, taken: dict[str, list[ModelSpec]]) -> str | None:
    return next((host for host, specs in taken.items() if any(s.name == model for s in specs)), None)


def _host_size(host: HostView) -> tuple[int, int, str]:
    gpus = host.inventory.gpus
    return (sum(g.free_bytes for g in gpus), len(gpus), host.name)


def _subset(config: Config, specs: Sequence[ModelSpec], host: HostView | None = None) -> Config:
    """`config` with only `specs` (no validation again: each spec was validated when the file was read), and
    `host`'s memory budget."""
    update: dict[str, object] = {"models": tuple(specs)}
    if host is not None:
        budget = host_budget(config, host)
        update["server"] = config.server.model_copy(update={"memory_budget_bytes": budget})
    return config.model_copy(update=update)


def host_budget(config: Config, host: HostView) -> int | None:
    """The host memory on-demand models may hold on `host` (see the module docstring)."""
    if config.server.memory_budget_bytes is not None or host.memory_available_bytes is None:
        return host_budget_bytes(config.server.memory_budget_bytes)
    return int(host.memory_available_bytes * HOST_BUDGET_FRACTION)


def _host_placement(config: Config, host: HostView, specs: Sequence[ModelSpec]) -> HostPlacement:
    report = (
        plan_models(_subset(config, specs, host), host.inventory)
        if specs
        else PlacementReport(inventory=host.inventory, decisions=[])
    )
    budget = host_budget(config, host)
    return HostPlacement(host=host.name, address=host.address, memory_budget_bytes=budget, report=report)


def _refused(
    spec: ModelSpec, closest: ModelDecision | None, considered: list[HostConsidered], known: set[str]
) -> ClusterDecision:
    answers = "; ".join(f"{c.host}: {c.outcome}" for c in considered) or "the cluster has no hosts"
    unknown = sorted(set(spec.hosts or ()) - known)
    if unknown:
        answers += f"; hosts named in the config but not in the cluster: {', '.join(unknown)}"
    refusal = f"no host can run it ({answers})"
    if closest is None:
        decision = ModelDecision(model=spec.name, refusal=refusal, load=spec.load)
    else:
        decision = closest.model_copy(update={"plan": None, "refusal": refusal})
    return ClusterDecision(model=spec.name, decision=decision, considered=considered)
