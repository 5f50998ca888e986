"""ClusterServing (gateway/cluster/serve.py), the gateway's side of `serve --cluster`, over fake host agents:
a model goes to its host's HostWorker; a lost host's models are re-placed where they fit and refused with a
503 naming the model and the lost host where not; a rejoining host gets back what it alone can run. The real
thing, over Ray with real workers, is tests/ray/test_cluster_serve.py."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.base import DeploymentPlan
from backends.llamacpp import LlamaCppAdapter
from gateway.app import _deployment
from gateway.cluster import HostLost, HostReport, WorkerReport
from gateway.cluster.host_worker import HostWorker
from gateway.cluster.serve import ClusterServing, host_gpus
from gateway.config import Config, ModelSpec
from gateway.errors import GatewayError
from gateway.lifecycle.deployments import Deployment, Registry
from gateway.lifecycle.memory import NoProbe, Pools
from gateway.lifecycle.workers import WorkerState
from gateway.ops.metrics import Metrics
from gateway.placement import Inventory


class Agent:
    """A host agent whose workers are READY at once, until `lose()`."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.lost = False
        self.started: list[str] = []
        self.running: set[str] = set()
        self.stopped: list[str] = []

    def _check(self) -> None:
        if self.lost:
            raise HostLost(self.host, "ActorDiedError")

    async def describe(self, paths: Sequence[str] = ()) -> HostReport:
        self._check()
        workers = [await self.worker(name) for name in sorted(self.running)]
        return HostReport(host=self.host, address="127.0.0.1", inventory=Inventory(), files=dict.fromkeys(paths, True),
                          workers=workers)  # fmt: skip

    async def start_worker(self, plan: DeploymentPlan, token: str, wait_s: float = 600.0) -> WorkerReport:
        self._check()
        self.started.append(plan.model)
        self.running.add(plan.model)
        return await self.worker(plan.model)

    async def worker(self, name: str) -> WorkerReport:
        self._check()
        return WorkerReport(name=name, state=WorkerState.READY, url=f"http://{self.host}.invalid:1")

    async def stop_worker(self, name: str, grace_s: float = 10.0) -> None:
        self._check()
        if name in self.running:
            self.running.discard(name)
            self.stopped.append(name)


class Residency:
    def __init__(self) -> None:
        self.retired: list[str] = []
        self.pools = Pools({}, NoProbe())

    def adopt(self, deployment: Deployment, memory: Any) -> None:
        deployment.worker.start()

    async def retire(self, deployment: Deployment) -> None:
        self.retired.append(deployment.name)
        await deployment.worker.stop()


class Discovery:
    def __init__(self) -> None:
        self.joined: dict[str, Any] = {}

        self.offered: dict[str, Any] = {}
        self.forgotten: list[str] = []

    async def __call__(self) -> tuple[dict[str, Any], set[str]]:
        joined, self.joined = self.joined, {}
        self.offered.update(joined)
        return joined, set()

    def forget(self, host: str) -> None:  # offered again next round, as RayDiscovery spawns a fresh agent
        self.forgotten.append(host)
        if host in self.offered:  # unless a newer agent of the host was offered meanwhile
            self.joined.setdefault(host, self.offered[host])


async def _until(check: Any) -> None:
    for _ in range(400):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not within 4 s")


def test_host_gpus_reads_simulated_layouts() -> None:
    assert host_gpus("a=2xv100-32gb, b=none") == {"a": "2xv100-32gb", "b": "none"}
    assert host_gpus("") == {}


def test_a_lost_host_is_replaced_where_it_fits_refused_where_not_and_regained(smollm2_path: Path) -> None:
    source = [{"gguf": str(smollm2_path)}]
    config = Config.model_validate({"gpus": "none", "models": [
        {"name": "alpha", "sources": source, "context": 512, "hosts": ["a"]},
        {"name": "beta", "sources": source, "context": 512},
        {"name": "gamma", "sources": source, "context": 512, "hosts": ["b"]},
    ]})  # fmt: skip
    specs = {spec.name: spec for spec in config.models}

    async def scenario() -> None:
        discovery = Discovery()
        serving = ClusterServing(config, discovery, interval_s=0.02, worker_interval_s=0.02)
        a, b = Agent("a"), Agent("b")
        await serving.join({"a": a, "b": b})
        plans, refused = serving.initial()
        assert refused == {} and serving.assignment == {"alpha": "a", "beta": "b", "gamma": "b"}
        metrics, registry, residency = Metrics(), Registry(), Residency()
        placements: list[dict[str, Any]] = []
        async with httpx.AsyncClient() as client:

            def make(plan: DeploymentPlan, spec: ModelSpec) -> Deployment:
                return _deployment(plan, spec, LlamaCppAdapter(), client, config, metrics, None, serving)

            for plan in plans:
                registry.add(make(plan, specs[plan.model]))
                registry.resolve(plan.model).worker.start()
            serving.start(registry, residency, make, metrics, placements.append)
            beta = registry.resolve("beta").worker
            assert isinstance(beta, HostWorker) and beta.host == "b"
            await beta.ensure_ready(5)
            assert beta.base_url() == "http://b.invalid:1"
            assert beta.headers["Authorization"].startswith("Bearer ")  # the launch secret, every call

            b.lost = True  # host b dies
            await _until(lambda: serving.assignment.get("beta") == "a")
            moved = registry.resolve("beta").worker
            assert isinstance(moved, HostWorker) and moved.host == "a"
            await moved.ensure_ready(5)
            assert a.started.count("beta") == 1
            with pytest.raises(GatewayError) as gone:
                registry.resolve("gamma")
            assert gone.value.status == 503
            assert "'gamma'" in gone.value.message and "its host 'b' is lost" in gone.value.message
            assert {d["model"]: d["host"] for d in placements[-1]["decisions"]}["gamma"] is None
            await _until(lambda: sorted(residency.retired) == ["beta", "gamma"])
            exported = metrics.registry.get_sample_value
            assert exported("voltgate:model_host", {"model": "beta", "host": "a"}) == 1
            assert exported("voltgate:model_host", {"model": "beta", "host": "b"}) == 0

            b2 = Agent("b")
            discovery.joined = {"b": b2}  # host b joins again
            await _until(lambda: serving.assignment.get("gamma") == "b")
            assert isinstance(registry.resolve("gamma").worker, HostWorker) and b2.started == ["gamma"]
            assert serving.assignment["beta"] == "a"  # nothing serving moves back
            await serving.close()
            for deployment in registry:
                await deployment.worker.stop()

    asyncio.run(scenario())


class SlowAgent(Agent):
    """An agent whose first `describe()` gets no answer (a new node still starting it on a busy machine)."""

    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.silent = 1

    async def describe(self, paths: Sequence[str] = ()) -> HostReport:
        if self.silent:
            self.silent -= 1
            raise HostLost(self.host, "GetTimeoutError")
        return await super().describe(paths)


def test_a_host_that_does_not_answer_when_it_joins_is_asked_again(smollm2_path: Path) -> None:
    config = Config.model_validate({"gpus": "none", "models": [
        {"name": "alpha", "sources": [{"gguf": str(smollm2_path)}], "context": 512, "hosts": ["b"]},
    ]})  # fmt: skip

    async def scenario() -> None:
        discovery = Discovery()
        serving = ClusterServing(config, discovery, interval_s=0.02, worker_interval_s=0.02)
        await serving.join({"a": Agent("a")})
        plans, refused = serving.initial()
        assert plans == [] and "alpha" in refused
        metrics, registry, residency = Metrics(), Registry(refused=refused), Residency()
        async with httpx.AsyncClient() as client:

            def make(plan: DeploymentPlan, spec: ModelSpec) -> Deployment:
                return _deployment(plan, spec, LlamaCppAdapter(), client, config, metrics, None, serving)

            serving.start(registry, residency, make, metrics, lambda _: None)
            discovery.joined = {"b": SlowAgent("b")}
            await _until(lambda: serving.assignment.get("alpha") == "b")  # joined on the second ask
            assert discovery.forgotten == ["b"]  # the first silence made discovery offer it again
            await serving.close()
            for deployment in registry:
                await deployment.worker.stop()

    asyncio.run(scenario())


class FrozenAgent(Agent):
    """A host that froze: after `freeze()` its memory readings never answer (`asked` is set once one waits),
    and after `gone()` its workers' polls fail, as Ray's do once the host is declared dead."""

    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.frozen = self.dead = False
        self.asked = asyncio.Event()

    async def describe(self, paths: Sequence[str] = ()) -> HostReport:
        if self.frozen:
            self.asked.set()
            await asyncio.Event().wait()  # no answer, ever
        return await super().describe(paths)

    async def worker(self, name: str) -> WorkerReport:
        if self.dead:
            raise HostLost(self.host, "GetTimeoutError")
        return await super().worker(name)


def test_a_frozen_hosts_readings_never_hold_back_its_models_re_placement(smollm2_path: Path) -> None:
    """Issue 35 item 7: the watch once waited behind a memory refresh of the frozen host (13 s measured); now
    the readings run beside it, each bounded by `refresh_s`."""
    config = Config.model_validate({"gpus": "none", "models": [
        {"name": "beta", "sources": [{"gguf": str(smollm2_path)}], "context": 512, "hosts": ["a", "b"]},
    ]})  # fmt: skip

    async def scenario() -> None:
        serving = ClusterServing(config, Discovery(), interval_s=0.02, worker_interval_s=0.02, refresh_s=0.02)
        agents = {"a": FrozenAgent("a"), "b": FrozenAgent("b")}
        await serving.join(agents)
        plans, _ = serving.initial()
        host = serving.assignment["beta"]
        metrics, registry, residency = Metrics(), Registry(), Residency()
        async with httpx.AsyncClient() as client:

            def make(plan: DeploymentPlan, spec: ModelSpec) -> Deployment:
                return _deployment(plan, spec, LlamaCppAdapter(), client, config, metrics, None, serving)

            for plan in plans:
                registry.add(make(plan, config.models[0]))
                registry.resolve(plan.model).worker.start()
            serving.start(registry, residency, make, metrics, lambda _: None)
            await asyncio.sleep(0.1)  # a refresh or two while all is well
            frozen = agents[host]  # the host that serves it
            frozen.frozen = True
            await asyncio.wait_for(frozen.asked.wait(), 5)  # a round of readings now waits on it
            frozen.dead = True
            other = "b" if host == "a" else "a"
            await _until(lambda: serving.assignment.get("beta") == other)
            await serving.close()
            for deployment in registry:
                await deployment.worker.stop()

    asyncio.run(scenario())


def test_a_frozen_host_that_answers_again_has_its_leftovers_stopped_and_is_taken_back(smollm2_path: Path) -> None:
    """Issue 35 item 7: a host lost while its Ray node lives (frozen, partitioned) came back unused until Ray was
    restarted there; now discovery offers it again every round, and once it answers its leftover worker (its
    model re-placed meanwhile) is stopped and the host serves again: a model only it can run returns to it."""
    config = Config.model_validate({"gpus": "none", "models": [
        {"name": "beta", "sources": [{"gguf": str(smollm2_path)}], "context": 512, "hosts": ["a", "b"]},
        {"name": "gamma", "sources": [{"gguf": str(smollm2_path)}], "context": 512, "hosts": ["b"]},
    ]})  # fmt: skip
    specs = {spec.name: spec for spec in config.models}

    async def scenario() -> None:
        discovery = Discovery()
        serving = ClusterServing(config, discovery, interval_s=0.02, worker_interval_s=0.02, refresh_s=0.05)
        a, b = FrozenAgent("a"), FrozenAgent("b")
        discovery.offered = {"a": a, "b": b}
        await serving.join({"a": a, "b": b})
        plans, _ = serving.initial()
        assert serving.assignment["gamma"] == "b"  # only b may run it (beta may land on either host)
        metrics, registry, residency = Metrics(), Registry(), Residency()
        async with httpx.AsyncClient() as client:

            def make(plan: DeploymentPlan, spec: ModelSpec) -> Deployment:
                return _deployment(plan, spec, LlamaCppAdapter(), client, config, metrics, None, serving)

            for plan in plans:
                registry.add(make(plan, specs[plan.model]))
                await registry.resolve(plan.model).worker.ensure_ready(5)
            serving.start(registry, residency, make, metrics, lambda _: None)
            assert b.running == {"gamma"} | ({"beta"} if serving.assignment["beta"] == "b" else set())
            b.frozen = b.dead = True  # host b freezes; its workers' polls fail
            await _until(lambda: "b" not in serving.agents and serving.assignment.get("beta") == "a")
            assert "gamma" not in serving.assignment  # only b can run it: refused while b is away
            await asyncio.sleep(0.2)  # rounds that ask the frozen host again, each bounded by refresh_s
            assert "b" in discovery.forgotten and "b" not in serving.agents
            b.frozen = b.dead = False  # b answers again, its old worker still running
            await _until(lambda: "b" in serving.agents and serving.assignment.get("gamma") == "b")
            assert "gamma" in b.stopped  # the leftover stopped before the host was used again
            assert serving.assignment["beta"] == "a"  # nothing serving moves back
            await serving.close()
            for deployment in registry:
                await deployment.worker.stop()

    asyncio.run(scenario())
