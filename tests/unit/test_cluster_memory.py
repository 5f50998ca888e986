"""Memory per host on a cluster (`voltgate serve --cluster`), over fake host agents and the real residency
manager: each host's on-demand budget comes from what its agent reported, loading a model on host B evicts
the least recently used idle model on B only (never one on A, even when A's is older), and what a worker
really uses is the figure its host's agent reports. The Ray-backed serve test is tests/ray/."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from backends.base import DeploymentPlan
from backends.llamacpp import LlamaCppAdapter
from gateway.app import _deployment
from gateway.cluster import HostReport, HostView, WorkerReport
from gateway.cluster.plan import plan_cluster
from gateway.cluster.serve import ClusterServing
from gateway.config import Config, ModelSpec
from gateway.lifecycle.deployments import Deployment, Registry
from gateway.lifecycle.memory import HOST
from gateway.lifecycle.residency import Residency
from gateway.lifecycle.workers import Status as ModelState
from gateway.lifecycle.workers import WorkerState
from gateway.ops.metrics import Metrics
from gateway.placement import Inventory

RSS = 300 << 20  # what each fake worker's host reports it uses


class Agent:
    """A host agent whose workers are READY at once, reporting a pid and their resident memory."""

    def __init__(self, host: str, available: int) -> None:
        self.host = host
        self.available = available
        self.running: dict[str, int] = {}
        self._pids = iter(range(1000, 2000))

    async def describe(self, paths: Sequence[str] = ()) -> HostReport:
        return HostReport(host=self.host, address="127.0.0.1", inventory=Inventory(),
                          files=dict.fromkeys(paths, True), memory_available_bytes=self.available)  # fmt: skip

    async def start_worker(self, plan: DeploymentPlan, token: str, wait_s: float = 600.0) -> WorkerReport:
        self.running.setdefault(plan.model, next(self._pids))
        return await self.worker(plan.model)

    async def worker(self, name: str) -> WorkerReport:
        if name not in self.running:
            return WorkerReport(name=name, state=WorkerState.STOPPED)
        return WorkerReport(name=name, state=WorkerState.READY, url=f"http://{self.host}.invalid:1",
                            pid=self.running[name], rss_bytes=RSS)  # fmt: skip

    async def stop_worker(self, name: str, grace_s: float = 10.0) -> None:
        self.running.pop(name, None)


def _config(smollm2_path: Path) -> Config:
    source = [{"gguf": str(smollm2_path)}]
    return Config.model_validate({"gpus": "none", "models": [
        {"name": name, "sources": source, "context": 512, "load": "on_demand", "hosts": [host]}
        for name, host in (("a1", "a"), ("b1", "b"), ("b2", "b"))
    ]})  # fmt: skip


def _estimate(config: Config) -> int:
    report = plan_cluster(config, [HostView(name="a", inventory=Inventory(), memory_available_bytes=1 << 40)])
    estimate = report.decision("a1").decision.estimate
    assert estimate is not None and estimate.host_bytes > 0
    return estimate.host_bytes


def test_the_plan_uses_each_hosts_own_budget_for_on_demand_models(smollm2_path: Path) -> None:
    config = _config(smollm2_path).model_copy(update={"models": (_config(smollm2_path).models[0].model_copy(
        update={"hosts": None}),)})  # fmt: skip
    need = _estimate(config)
    small = HostView(name="small", inventory=Inventory(), memory_available_bytes=need)  # 80 % of it: too little
    large = HostView(name="large", inventory=Inventory(), memory_available_bytes=4 * need)
    report = plan_cluster(config, [small, large])
    assert report.host_of("a1") == "large"
    outcomes = {c.host: c.outcome for c in report.decision("a1").considered}
    assert outcomes["small"].startswith("refused"), outcomes
    assert {h.host: h.memory_budget_bytes for h in report.hosts} == {"small": int(0.8 * need),
                                                                       "large": int(3.2 * need)}  # fmt: skip


def test_loading_on_host_b_evicts_the_least_recently_used_model_on_b_only(smollm2_path: Path) -> None:
    config = _config(smollm2_path)
    specs = {spec.name: spec for spec in config.models}
    need = max(_estimate(config), RSS)
    available = int(1.5 * need / 0.8)  # each host's budget (80 % of it) holds one of these models, not two

    async def scenario() -> None:
        a, b = Agent("a", available), Agent("b", available)
        serving = ClusterServing(config, _no_news, interval_s=0.02, worker_interval_s=0.02)
        await serving.join({"a": a, "b": b})
        plans, refused = serving.initial()
        assert refused == {} and serving.assignment == {"a1": "a", "b1": "b", "b2": "b"}
        metrics, registry = Metrics(), Registry()
        async with httpx.AsyncClient() as client:
            residency = Residency.from_placement(registry, config.server, metrics, serving.placement())

            def make(plan: DeploymentPlan, spec: ModelSpec) -> Deployment:
                return _deployment(plan, spec, LlamaCppAdapter(), client, config, metrics, residency.on_worker_state,
                                   serving)  # fmt: skip

            for plan in plans:
                registry.add(make(plan, specs[plan.model]))
            serving.start(registry, residency, make, metrics, lambda _: None)
            try:
                await _use(residency, registry, "a1")  # the least recently used model of the whole cluster
                await _use(residency, registry, "b1")
                pools = residency.budgets()
                assert HOST not in pools and pools["b:host"]["budget_bytes"] == int(available * 0.8)
                assert pools["a:host"]["held_bytes"] == RSS  # the agent's figure, not this machine's /proc
                await _use(residency, registry, "b2")
                assert residency.state(registry.resolve("a1")) is ModelState.READY
                assert residency.state(registry.resolve("b1")) is ModelState.UNLOADED
                assert set(a.running) == {"a1"} and set(b.running) == {"b2"}
                b.available, serving.refresh_s = 123 << 20, 0.02  # host b's MemAvailable drops
                await _until(lambda: residency.pools.live_free("b:host") == 123 << 20)  # asked of its agent
                assert residency.pools.live_free("a:host") == available
            finally:
                await serving.close()
                await residency.close()

    asyncio.run(scenario())


async def _use(residency: Residency, registry: Registry, model: str) -> None:
    hold = await residency.ensure_loaded(registry.resolve(model), wait_s=10)
    hold.release()
    await asyncio.sleep(0.05)  # its HostWorker polls its agent once more: the measured use is in


async def _until(check: Any) -> None:
    for _ in range(400):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not within 4 s")


async def _no_news() -> tuple[dict[str, Any], set[str]]:
    return {}, set()
