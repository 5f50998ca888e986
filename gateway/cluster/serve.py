"""`voltgate serve --cluster`: the gateway's deployments over a cluster's hosts, and what it does when one goes.

`open_cluster(target, config)` connects to the live Ray cluster, starts (or finds) every host's agent, and
plans the config over those hosts (`plan_cluster`; the first plan resolves each `replicas: auto` over the
hosts, and `ClusterServing.config` keeps that number for every re-plan). The app builds each model placed on a
host as a `HostWorker` (`ClusterServing.worker_for`), reached over HTTP with its launch secret; models that
are remote endpoints are served as before.

`ClusterServing.start` watches the cluster (every `interval_s`):

* a host is lost when a call on its agent fails (`HostWorker.lost`) or Ray reports its node dead. Its
  in-flight streams were already cut by the worker's death (the relay's error frame, then `[DONE]`); its
  models are planned again over the remaining hosts, the models that still run elsewhere pinned where they
  are (nothing serving is moved). A model that fits goes to its new host (a fresh `HostWorker`); one that
  does not is refused with a 503 naming it, the lost host and why no other host can take it;
* a host that joins (a Ray node declaring `voltgate_host:<name>`, or the same name on a new node) gets an
  agent, and the models that are not served (refused by the loss, or never placed) are planned again;
* a host lost while its Ray node lives on (frozen, partitioned) is offered again by discovery every round; once
  its agent answers (each ask bounded by `refresh_s`), the workers it still runs from before the loss (served
  elsewhere now) are stopped and the host joins again like a new one, without restarting Ray there.

Memory per host: each host's pools (`<host>:host`, `<host>:gpu<i>`, `gateway.lifecycle.memory`) are given to
the residency manager at start and when a host joins, with a `ReportedProbe` per host that this side keeps
current (the host's MemAvailable and GPU readings every `refresh_s`, each worker's measured use at every
poll of its `HostWorker`): loading an on-demand model on host B evicts only models on B.

Re-placing swaps the registry's deployment the way a config reload does (`gateway.reload`): the new one is
registered first, the old one is retired in the background (its worker is on a lost host: nothing to drain).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import Gauge

from backends.base import DeploymentPlan
from gateway.cluster.agent import HostAgent, HostLost, HostReport
from gateway.cluster.host_worker import POLL_INTERVAL_S, HostWorker
from gateway.cluster.hosts import HostView
from gateway.cluster.live import ClusterUnavailable, connect, hosts_from_agents, is_live
from gateway.cluster.plan import ClusterReport, plan_cluster, plan_cluster_with_replicas
from gateway.config import Config, ModelSpec
from gateway.config_replicas import chosen_between
from gateway.lifecycle.deployments import Deployment, Registry
from gateway.lifecycle.memory import ModelMemory, Pools, ReportedProbe
from gateway.lifecycle.workers import Worker, WorkerState
from gateway.ops.metrics import Metrics
from gateway.placement.inventory import Inventory

log = logging.getLogger("voltgate.cluster")

WATCH_INTERVAL_S = 1.0
REFRESH_S = 5.0  # how often each host's live memory readings are asked for
HOST_GPUS_ENV = "VOLTGATE_HOST_GPUS"  # simulated inventories per host: "a=2xv100-32gb,b=none" (tests, dry runs)


class Discover(Protocol):
    """Where hosts come from: a call answers the hosts that joined (new agents) and the names of the hosts
    that are gone, since the last call; `forget(host)` drops a host whose agent did not answer, so the next
    call offers it again with a fresh agent (a busy new node may be slow to start one; a dead one never
    answers)."""

    def __call__(self) -> Awaitable[tuple[dict[str, HostAgent], set[str]]]: ...

    def forget(self, host: str) -> None: ...


class Residency(Protocol):
    """What re-placing needs of `gateway.lifecycle.residency.Residency`."""

    pools: Pools

    def adopt(self, deployment: Deployment, memory: Any) -> None: ...

    async def retire(self, deployment: Deployment) -> None: ...


def host_gpus(raw: str | None = None) -> dict[str, str]:
    """`VOLTGATE_HOST_GPUS` ("a=v100-16gb,b=none"): a simulated inventory for the named hosts' agents."""
    raw = os.environ.get(HOST_GPUS_ENV, "") if raw is None else raw
    pairs = (item.split("=", 1) for item in raw.split(",") if "=" in item)
    return {name.strip(): layout.strip() for name, layout in pairs}


class RayDiscovery:
    """`Discover` over Ray: the alive nodes that declare `voltgate_host:<name>`, by node id."""

    def __init__(self, gpus: Mapping[str, str], silence_s: float) -> None:
        self._gpus = dict(gpus)
        self._silence_s = silence_s  # `server.host_silence_s`: each call on an agent is bounded by it
        self._nodes: dict[str, str] = {}  # host -> the node id its agent runs on

    async def __call__(self) -> tuple[dict[str, HostAgent], set[str]]:
        from gateway.cluster import ray_agent

        nodes = await asyncio.to_thread(ray_agent.cluster_nodes)
        gone = {host for host, node in self._nodes.items() if nodes.get(host, (None, None))[1] != node}
        for host in gone:  # its node left: its agent there is gone, or never started (asked while the node died)
            ray_agent.kill_agent(host, self._nodes.pop(host))
        joined: dict[str, HostAgent] = {}
        for host, (ip, node) in nodes.items():
            if host not in self._nodes:
                self._nodes[host] = node
                joined[host] = ray_agent.spawn_agent(host, node, bind_host=ip, gpus=self._gpus.get(host, "auto"),
                                                     call_timeout_s=self._silence_s)  # fmt: skip
        return joined, gone

    def forget(self, host: str) -> None:
        self._nodes.pop(host, None)


@dataclass
class ClusterServing:
    """The cluster side of a gateway: hosts, agents, where each model runs; see the module docstring."""

    config: Config
    discover: Discover
    agents: dict[str, HostAgent] = field(default_factory=dict)
    views: dict[str, HostView] = field(default_factory=dict)
    assignment: dict[str, str] = field(default_factory=dict)  # model -> host, for the models served on hosts
    report: ClusterReport | None = None
    interval_s: float = WATCH_INTERVAL_S
    worker_interval_s: float = POLL_INTERVAL_S  # how often each HostWorker asks its host about its worker
    refresh_s: float = REFRESH_S
    probes: dict[str, ReportedProbe] = field(default_factory=dict)  # each host's readings, for the residency
    _task: asyncio.Task[None] | None = None
    _background: set[asyncio.Task[None]] = field(default_factory=set)
    _refreshing: asyncio.Task[None] | None = None  # the memory readings in flight, apart from the watch
    _on_placement: Callable[[dict[str, Any]], None] | None = None
    _host_gauge: Gauge | None = None
    _seen: set[str] = field(default_factory=set)  # every host that ever joined (the gauge's label values)
    _returning: set[str] = field(default_factory=set)  # lost while its node lives: its leftovers to stop on return

    async def join(self, agents: Mapping[str, HostAgent]) -> None:
        """Ask each new host's agent for its inventory and files (all at once); a host that does not answer is
        left out and forgotten by discovery, which offers it again next round with a fresh agent, until its node
        leaves. A host that returns after a loss is asked within `refresh_s` (it may still be frozen) and has
        the workers it kept from before the loss stopped first."""
        asks = [self._ask(host, agent) for host, agent in agents.items()]
        for host, agent, view in zip(agents, agents.values(), await asyncio.gather(*asks), strict=True):
            if view is None:
                self.discover.forget(host)
                continue
            self._returning.discard(host)
            self.agents[host], self.views[host] = agent, view
            self.probes[host] = ReportedProbe()
            _read(self.probes[host], view.inventory, view.memory_available_bytes)
            self._seen.add(host)
            log.info("host %s joined (%d GPU(s))", host, len(view.inventory.gpus))

    async def _ask(self, host: str, agent: HostAgent) -> HostView | None:
        """The host's view, or None when it does not answer (logged)."""
        returning = host in self._returning
        try:
            async with asyncio.timeout(self.refresh_s if returning else None):  # it may still be frozen
                (view,) = await hosts_from_agents([agent], self.config)
            if returning:  # it answers: its stops take what they take (each bounded by the agent's call timeout)
                await self._stop_leftovers(host, agent)
        except (HostLost, TimeoutError) as exc:
            why = str(exc) or f"no answer within {self.refresh_s:g} s"
            log.warning("host %s did not answer: %s; asking again with a fresh agent", host, why)
            return None
        return view

    async def _stop_leftovers(self, host: str, agent: HostAgent) -> None:
        """Stop what a returning host still runs from before its loss: those models are served elsewhere (or
        refused) now, and their memory is the host's again."""
        for worker in (await agent.describe()).workers:
            if self.assignment.get(worker.name) != host:
                log.warning("host %s is back: stopping its leftover worker %s", host, worker.name)
                await agent.stop_worker(worker.name, grace_s=2.0)  # unused since the loss: no request to finish

    def plan(self) -> ClusterReport:
        """Plan over the live hosts, each model that is served on one of them pinned there. The first plan
        resolves each `replicas: auto` over the hosts then (`plan_cluster_with_replicas`) and `config` keeps the
        number, its replicas made: a re-plan after a host is lost or joins places the same replicas, never a
        new N (a running replica is never dropped or renamed by a re-plan)."""
        if any(chosen_between(spec.replicas) is not None for spec in self.config.models):
            self.config, self.report = plan_cluster_with_replicas(self.config, list(self.views.values()))
            return self.report
        specs = tuple(
            spec.model_copy(update={"hosts": (self.assignment[spec.name],)})
            if self.assignment.get(spec.name) in self.agents
            else spec
            for spec in self.config.models
        )
        report = plan_cluster(self.config.model_copy(update={"models": specs}), list(self.views.values()))
        self.report = report
        return report

    def placement(self) -> dict[str, Any]:
        """The ClusterReport as `/v1/placement` serves it: each decision also carries its `prediction` and
        `plan` at the top level (where the single-host report has them, for the metrics and residency)."""
        assert self.report is not None
        data: dict[str, Any] = self.report.model_dump(mode="json")
        data["cluster"] = True
        for decision in data["decisions"]:
            decision["prediction"] = decision["decision"].get("prediction")
        return data

    def initial(self) -> tuple[list[DeploymentPlan], dict[str, str]]:
        """The plans to serve at start and the models refused (with why); records each model's host."""
        report = self.plan()
        plans, refused = [], {}
        for d in report.decisions:
            if d.decision.plan is None:
                refused[d.model] = d.decision.refusal or "not placed"
                continue
            plans.append(d.decision.plan)
            if d.host is not None:
                self.assignment[d.model] = d.host
        return plans, refused

    def worker_for(self, plan: DeploymentPlan, on_state: Callable[[str, WorkerState], None]) -> Worker | None:
        """The worker of a model placed on a host (None: not on a host, the app builds it as before)."""
        host = self.assignment.get(plan.model)
        if host is None or host not in self.agents:
            return None
        return HostWorker(plan, self.agents[host], interval_s=self.worker_interval_s, on_state=on_state,
                          probe=self.probes.get(host))  # fmt: skip

    def start(
        self, registry: Registry, residency: Residency, make: Callable[[DeploymentPlan, ModelSpec], Deployment],
        metrics: Metrics, on_placement: Callable[[dict[str, Any]], None],
    ) -> None:  # fmt: skip
        """Watch the hosts (the app's lifespan calls this once its registry exists)."""
        self._on_placement = on_placement
        self._attach(residency)
        self._task = asyncio.create_task(self._watch(registry, residency, make), name="cluster:watch")
        self._host_gauge = Gauge("voltgate:model_host", "1 for the host a model is served on (cluster mode)",
                                 ["model", "host"], registry=metrics.registry)  # fmt: skip
        for model, host in self.assignment.items():
            self._set_host(model, host)

    async def close(self) -> None:
        for task in (self._task, self._refreshing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def _attach(self, residency: Residency) -> None:
        """Give the residency manager every host's pools: the budget its plan used, its probe."""
        budgets = {h.host: h.memory_budget_bytes for h in self.report.hosts} if self.report is not None else {}
        for host, view in self.views.items():
            residency.pools.add_host(host, view.inventory, budgets.get(host), self.probes[host])

    def _refresh_soon(self) -> None:
        """Start a round of readings beside the watch, unless one is still in flight: a frozen host's silence
        delays only its readings, never the watch's loss detection and re-placement."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.create_task(self._refresh(), name="cluster:refresh")
            self._background.add(self._refreshing)
            self._refreshing.add_done_callback(self._background.discard)

    async def _refresh(self) -> None:
        """Every host's live memory readings, each bounded by `refresh_s` (a host that does not answer is left
        to its workers' polls)."""
        agents = list(self.agents.items())
        asks = (asyncio.wait_for(agent.describe(), self.refresh_s) for _, agent in agents)
        reports = await asyncio.gather(*asks, return_exceptions=True)
        for (host, _), report in zip(agents, reports, strict=True):
            if isinstance(report, HostReport) and host in self.probes:
                _read(self.probes[host], report.inventory, report.memory_available_bytes)

    async def _watch(
        self, registry: Registry, residency: Residency, make: Callable[[DeploymentPlan, ModelSpec], Deployment]
    ) -> None:
        last_refresh = asyncio.get_running_loop().time()
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                if asyncio.get_running_loop().time() - last_refresh >= self.refresh_s:
                    last_refresh = asyncio.get_running_loop().time()
                    self._refresh_soon()
                lost = {d.worker.host: d.worker.lost for d in registry
                        if isinstance(d.worker, HostWorker) and d.worker.lost}  # fmt: skip
                joined, gone = await self.discover()
                self._returning -= gone  # a new node of the host: a host that joins, not one that returns
                lost.update({host: f"host {host!r} left the cluster" for host in gone if host in self.agents})
                displaced = {m: h for m, h in self.assignment.items() if h in lost}
                for host in lost:
                    if host not in gone:  # its node lives: it may come back (frozen, partitioned)
                        self._returning.add(host)
                        self.discover.forget(host)
                    self.agents.pop(host, None)
                    self.views.pop(host, None)
                    self.probes.pop(host, None)
                    residency.pools.drop_host(host)
                    log.error("host %s is lost (%s): re-placing its models %s", host, lost[host], sorted(displaced))
                for model in displaced:
                    del self.assignment[model]
                await self.join(joined)
                if lost or self.agents.keys() & joined.keys():
                    self._replace(registry, residency, make, displaced, lost)
                    self._attach(residency)  # a host that joined gets its pools
            except Exception:  # the watch must outlive any one bad round (a host answering garbage, Ray hiccups)
                log.exception("cluster watch: this round failed; trying again in %.0f s", self.interval_s)

    def _replace(
        self, registry: Registry, residency: Residency, make: Callable[[DeploymentPlan, ModelSpec], Deployment],
        displaced: Mapping[str, str], lost: Mapping[str, str | None],
    ) -> None:  # fmt: skip
        """Re-plan; move each displaced model (and each refused one) to where the plan puts it, or refuse it."""
        report = self.plan()
        specs = {spec.name: spec for spec in self.config.models}
        for d in report.decisions:
            if d.model in self.assignment or (d.model not in displaced and d.model not in registry.refused):
                continue  # serving on a live host, or not a cluster model (a remote endpoint)
            if d.model not in displaced and (d.host is None or d.decision.plan is None):
                continue  # refused before and still: its reason stands
            old = registry.remove(d.model)
            if old is not None:
                task = asyncio.create_task(residency.retire(old), name=f"cluster:retire:{d.model}")
                self._background.add(task)
                task.add_done_callback(self._background.discard)
            if d.host is None or d.decision.plan is None:
                was = displaced[d.model]
                registry.refused[d.model] = f"its host {was!r} is lost ({lost.get(was) or 'gone'}); " + (
                    d.decision.refusal or "no host can run it"
                )
                self._set_host(d.model, None)
                log.error("model %s not served: %s", d.model, registry.refused[d.model])
                continue
            self.assignment[d.model] = d.host
            registry.refused.pop(d.model, None)
            fresh = make(d.decision.plan, specs[d.model])  # worker_for builds its HostWorker on d.host
            registry.add(fresh)
            # a pinned model starts now; an on-demand one at its next request, weighed against its new host's pools
            residency.adopt(fresh, ModelMemory.from_estimate(d.decision.estimate, d.host))
            self._set_host(d.model, d.host)
            log.info("model %s placed on host %s", d.model, d.host)
        if self._on_placement is not None:
            self._on_placement(self.placement())

    def _set_host(self, model: str, host: str | None) -> None:
        if self._host_gauge is not None:
            for other in self._seen:
                self._host_gauge.labels(model, other).set(1 if other == host else 0)


def _read(probe: ReportedProbe, inventory: Inventory, available: int | None) -> None:
    """A host's readings into its probe: MemAvailable, and each GPU's used / free memory where NVML read them."""
    live = inventory.source == "nvml"
    probe.update_host(available, {g.index: (g.total_bytes - g.free_bytes, g.free_bytes) for g in inventory.gpus
                                  if live})  # fmt: skip


def open_cluster(target: str, config: Config) -> ClusterServing:
    """Connect to the live cluster (`ray`: RAY_ADDRESS, else the local head; `ray:HOST:PORT`), start every
    host's agent and plan over the hosts. Raises `ClusterUnavailable` with the reason."""
    if not is_live(target):
        raise ClusterUnavailable(
            f"--cluster {target}: serving needs a live cluster ('ray' or 'ray:HOST:PORT'); a cluster file is for "
            "`voltgate plan --cluster`"
        )
    connect(target)
    serving = ClusterServing(config, RayDiscovery(host_gpus(), config.server.host_silence_s))

    async def first() -> None:
        joined, _ = await serving.discover()
        await serving.join(joined)

    asyncio.run(first())
    if not serving.agents:
        raise ClusterUnavailable("the Ray cluster has no host declaring a voltgate_host:<name> resource")
    return serving
