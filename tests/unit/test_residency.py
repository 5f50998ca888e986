"""The residency manager in-process, against workers whose loads take time and may fail (no sockets).

Races first: concurrent requests cause one load, a model with requests in flight is never stopped (it is
drained, up to the bound), a just-loaded model cannot be evicted before its waiters use it; then failures
(remembered with backoff, a crash frees the memory), idle unloading, pinned models and the numbers.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from backends.base import DeploymentPlan, EngineName
from backends.llamacpp import LlamaCppAdapter
from gateway.admission import Admission
from gateway.config import ServerSettings
from gateway.errors import GatewayError
from gateway.lifecycle import policy as policy_module
from gateway.lifecycle import residency as residency_module
from gateway.lifecycle.deployments import Deployment, Registry
from gateway.lifecycle.memory import HOST, ModelMemory, Pools
from gateway.lifecycle.residency import Residency
from gateway.lifecycle.workers import Status as ModelState
from gateway.lifecycle.workers import WorkerState
from gateway.ops.metrics import Metrics
from tests.fakes.loading_worker import FakeLoadingWorker

MB = 1 << 20  # MiB: 100 MB reads 0.10 GiB


@dataclass
class FakeProbe:
    """Stands for `gateway.lifecycle.memory.SystemProbe`: RSS per process group, MemAvailable as set by the test."""

    rss: dict[int, int] = field(default_factory=dict)
    available: int | None = None

    def gpu_used_bytes(self, index: int) -> int | None:
        return None

    def gpu_free_bytes(self, index: int) -> int | None:
        return None

    def host_available_bytes(self) -> int | None:
        return self.available

    def group_rss_bytes(self, pgid: int) -> int | None:
        return self.rss.get(pgid)


class Harness:
    """Models by name with their load setting and estimated host bytes, a host budget, fake workers."""

    def __init__(
        self,
        models: dict[str, tuple[str, int]],
        budget: int | None,
        *,
        drain_s: float = 2.0,
        load_s: float = 0.02,
        wait_s: float = 5.0,
        idle: dict[str, float] | None = None,
    ) -> None:
        self.metrics = Metrics(gpu=False)
        self.registry = Registry()
        self.probe = FakeProbe()
        self.settings = ServerSettings(
            drain_timeout_s=drain_s, keepalive_interval_s=0.05, load_wait_s=wait_s, startup_timeout_s=5
        )
        memory = {name: ModelMemory(estimated={HOST: n}) for name, (_, n) in models.items()}
        pools = Pools({HOST: budget}, self.probe)
        self.residency = Residency(self.registry, self.settings, self.metrics, pools, memory)
        self.workers: dict[str, FakeLoadingWorker] = {}
        for name, (load, _) in models.items():
            worker = FakeLoadingWorker(name, load_s=load_s, on_state=self.residency.on_worker_state)
            plan = DeploymentPlan(model=name, engine=EngineName.LLAMACPP, source_path=Path("/m.gguf"),
                                  model_format="gguf", context_tokens=512)  # fmt: skip
            admission = Admission(name, 2, 8, queue_timeout_s=5)
            deployment = Deployment(name, (), plan, LlamaCppAdapter(), worker, admission, load=load,
                                    idle_unload_s=(idle or {}).get(name))  # fmt: skip
            self.registry.add(deployment)
            self.workers[name] = worker

    def d(self, name: str) -> Deployment:
        return self.registry.resolve(name)

    async def hold(self, name: str, wait_s: float | None = None) -> residency_module.Hold:
        return await self.residency.ensure_loaded(self.d(name), wait_s=wait_s)

    def state(self, name: str) -> ModelState:
        return self.residency.state(self.d(name))

    def sample(self, metric: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(metric, labels) or 0.0


ON_DEMAND = "on_demand"


# -- one load, holds ---------------------------------------------------------------------------------------
async def test_sixteen_concurrent_requests_for_an_unloaded_model_cause_one_load() -> None:
    h = Harness({"a": (ON_DEMAND, 100 * MB)}, 1000 * MB, load_s=0.1)
    holds = await asyncio.gather(*(h.hold("a") for _ in range(16)))
    assert h.workers["a"].starts == 1
    assert h.sample("voltgate:model_loads_total", model="a", outcome="ok") == 1
    assert h.residency.describe(h.d("a"))["in_flight"] == 16
    for hold in holds:
        hold.release()
        hold.release()  # idempotent
    assert h.residency.describe(h.d("a"))["in_flight"] == 0
    assert h.state("a") is ModelState.READY


async def test_a_waiter_that_gives_up_does_not_stop_the_load_for_the_others() -> None:
    h = Harness({"a": (ON_DEMAND, 100 * MB)}, 1000 * MB, load_s=0.2)
    impatient = asyncio.ensure_future(h.hold("a"))
    patient = asyncio.ensure_future(h.hold("a"))
    await asyncio.sleep(0.05)
    impatient.cancel()
    hold = await patient
    assert h.workers["a"].starts == 1 and h.state("a") is ModelState.READY
    assert h.residency.describe(h.d("a"))["in_flight"] == 1  # the cancelled waiter holds nothing
    hold.release()


async def test_a_wait_past_its_bound_is_a_503_and_the_load_goes_on() -> None:
    h = Harness({"a": (ON_DEMAND, 100 * MB)}, 1000 * MB, load_s=0.3)
    with pytest.raises(GatewayError) as info:
        await h.hold("a", wait_s=0.05)
    assert info.value.status == 503 and "still loading" in info.value.message
    assert "retry-after" in info.value.headers()
    await asyncio.sleep(0.4)
    assert h.state("a") is ModelState.READY
    (await h.hold("a")).release()
    assert h.workers["a"].starts == 1


# -- eviction ----------------------------------------------------------------------------------------------
async def test_the_least_recently_used_idle_model_is_evicted_and_the_log_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="voltgate.residency")
    h = Harness({m: (ON_DEMAND, 100 * MB) for m in "abc"}, 250 * MB)
    (await h.hold("a")).release()
    (await h.hold("b")).release()
    (await h.hold("c")).release()
    assert (h.state("a"), h.state("b"), h.state("c")) == (ModelState.UNLOADED, ModelState.READY, ModelState.READY)
    assert h.sample("voltgate:model_evictions_total", model="a", reason="memory") == 1
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("unloading a"))
    assert "least recently used" in line and "'c' needs host 0.10 GiB estimated" in line


async def test_eviction_never_picks_a_model_with_requests_in_flight() -> None:
    h = Harness({m: (ON_DEMAND, 100 * MB) for m in "abc"}, 250 * MB)
    in_flight = await h.hold("a")  # a is the least recently used, but busy
    (await h.hold("b")).release()
    (await h.hold("c")).release()
    assert h.state("a") is ModelState.READY and h.workers["a"].stops == 0
    assert h.state("b") is ModelState.UNLOADED
    in_flight.release()


async def test_a_busy_model_is_drained_before_it_is_unloaded(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="voltgate.residency")
    h = Harness({m: (ON_DEMAND, 100 * MB) for m in "ab"}, 150 * MB)
    in_flight = await h.hold("a")
    loading_b = asyncio.ensure_future(h.hold("b"))
    await asyncio.sleep(0.1)
    assert h.state("a") is ModelState.DRAINING and h.workers["a"].stops == 0
    assert "1 request(s) on 'a' to finish" in h.residency.progress(h.d("b")).phase  # the waiter says so
    late_a = asyncio.ensure_future(h.hold("a"))  # a request for a draining model waits for its next load
    await asyncio.sleep(0.05)
    assert not late_a.done()
    released_at = asyncio.get_running_loop().time()
    in_flight.release()
    hold_b = await loading_b
    assert h.workers["a"].stopped_at[0] >= released_at  # stopped only once its request finished
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("unloading a"))
    assert "busy with 1 request(s), unloaded after they finished" in line  # logged after the drain, and says so
    assert h.workers["b"].starts == 1 and h.workers["b"].stops == 0
    assert h.state("b") is ModelState.DRAINING  # a's waiter already wants the memory back: b drains
    hold_b.release()
    (await late_a).release()  # a is loaded again, evicting b (idle now)
    assert h.workers["a"].starts == 2 and h.state("b") is ModelState.UNLOADED


async def test_a_drain_past_its_bound_leaves_the_busy_model_serving_and_says_why() -> None:
    h = Harness({m: (ON_DEMAND, 100 * MB) for m in "ab"}, 150 * MB, drain_s=0.1)
    in_flight = await h.hold("a")
    with pytest.raises(GatewayError) as info:
        await h.hold("b")
    assert info.value.status == 503
    assert "'a'" in info.value.message and "1 request(s) in flight after 0 s" in info.value.message
    assert h.state("a") is ModelState.READY and h.workers["a"].stops == 0
    assert h.state("b") is ModelState.UNLOADED  # not failed: the next request tries again at once
    in_flight.release()
    (await h.hold("b")).release()
    assert h.state("a") is ModelState.UNLOADED


async def test_a_model_just_loaded_cannot_be_evicted_before_its_waiters_use_it() -> None:
    h = Harness({m: (ON_DEMAND, 100 * MB) for m in "ab"}, 150 * MB, drain_s=0.1)
    a = asyncio.ensure_future(h.hold("a"))
    await asyncio.sleep(0)  # a's load takes the lock first
    b = asyncio.ensure_future(h.hold("b"))  # queued behind it, needing a's memory
    hold_a = await a
    with pytest.raises(GatewayError):  # a was granted in the same step it became READY: b must drain it
        await b
    assert h.state("a") is ModelState.READY and h.workers["a"].stops == 0
    hold_a.release()


async def test_a_pinned_model_is_never_evicted_and_a_model_that_cannot_fit_is_refused_with_numbers() -> None:
    h = Harness({"p": ("always", 100 * MB), "a": (ON_DEMAND, 100 * MB), "big": (ON_DEMAND, 200 * MB)}, 250 * MB)
    await h.residency.start()
    try:
        (await h.hold("a")).release()
        with pytest.raises(GatewayError) as info:
            await h.hold("big")
        message = info.value.message
        assert "'big' cannot be loaded" in message and "needs 0.20 GiB (estimated)" in message
        assert "pinned models hold 'p' 0.10 GiB" in message
        assert h.state("p") is ModelState.READY and h.workers["p"].stops == 0
        assert h.state("a") is ModelState.READY  # nothing was evicted for a load that could not fit anyway
    finally:
        await h.residency.close()


# -- failures ----------------------------------------------------------------------------------------------
async def test_a_failed_load_reaches_every_waiter_and_is_remembered_with_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(policy_module, "BACKOFF_INITIAL_S", 0.3)
    h = Harness({"bad": (ON_DEMAND, 100 * MB)}, 1000 * MB, load_s=0.05)
    h.workers["bad"].fail = "exited with code 1 during start; last log lines: invalid GGUF"
    results = await asyncio.gather(*(h.hold("bad") for _ in range(4)), return_exceptions=True)
    assert all(isinstance(r, GatewayError) and "invalid GGUF" in r.message for r in results)
    assert h.workers["bad"].starts == 1 and h.workers["bad"].stops == 1
    with pytest.raises(GatewayError) as info:  # at once, without a new start
        h.residency.check(h.d("bad"))
    assert "failed to load" in info.value.message and int(info.value.headers()["retry-after"]) >= 1
    with pytest.raises(GatewayError):
        await h.hold("bad")
    assert h.workers["bad"].starts == 1
    assert h.state("bad") is ModelState.FAILED
    assert h.sample("voltgate:model_loads_total", model="bad", outcome="failed") == 1
    await asyncio.sleep(0.35)
    h.workers["bad"].fail = None  # the file was fixed: after the backoff the next request loads it
    (await h.hold("bad")).release()
    assert h.workers["bad"].starts == 2 and h.state("bad") is ModelState.READY


async def test_an_admin_load_retries_a_failed_model_without_waiting_for_its_backoff() -> None:
    h = Harness({"m": (ON_DEMAND, 100 * MB)}, 1000 * MB)
    h.workers["m"].fail = "boom"
    with pytest.raises(GatewayError):
        await h.hold("m")
    h.workers["m"].fail = None
    await h.residency.load(h.d("m"))
    assert h.state("m") is ModelState.READY and h.workers["m"].starts == 2


async def test_a_crash_while_serving_frees_its_memory_and_is_failed_until_retried() -> None:
    h = Harness({m: (ON_DEMAND, 100 * MB) for m in "ab"}, 150 * MB)
    (await h.hold("a")).release()
    h.workers["a"].crash()
    assert h.state("a") is ModelState.FAILED
    assert h.residency.budgets()[HOST]["held_bytes"] == 0
    (await h.hold("b")).release()  # fits without evicting anything: a holds no memory
    assert h.sample("voltgate:model_evictions_total", model="a", reason="memory") == 0


# -- idle, admin, measurement ------------------------------------------------------------------------------
async def test_an_idle_model_is_unloaded_after_its_idle_unload_s(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(residency_module, "REAP_INTERVAL_S", 0.05)
    h = Harness({"a": (ON_DEMAND, 100 * MB), "b": (ON_DEMAND, 100 * MB)}, 1000 * MB, idle={"a": 0.2})
    await h.residency.start()
    try:
        hold = await h.hold("a")
        (await h.hold("b")).release()
        await asyncio.sleep(0.4)
        assert h.state("a") is ModelState.READY  # a request in flight keeps it, however long
        hold.release()
        await asyncio.sleep(0.4)
        assert h.state("a") is ModelState.UNLOADED and h.state("b") is ModelState.READY  # b has no idle_unload_s
        assert h.sample("voltgate:model_evictions_total", model="a", reason="idle") == 1
    finally:
        await h.residency.close()
    assert all(w.state is WorkerState.STOPPED for w in h.workers.values())


async def test_admin_unload_drains_and_refuses_a_pinned_model() -> None:
    h = Harness({"p": ("always", 10 * MB), "a": (ON_DEMAND, 10 * MB)}, 1000 * MB)
    (await h.hold("a")).release()
    await h.residency.unload(h.d("a"))
    assert h.state("a") is ModelState.UNLOADED
    assert h.sample("voltgate:model_evictions_total", model="a", reason="admin") == 1
    with pytest.raises(GatewayError) as info:
        await h.residency.unload(h.d("p"))
    assert info.value.status == 400 and "pinned" in info.value.message


async def test_measured_memory_replaces_the_estimate_in_the_next_decision() -> None:
    h = Harness({m: (ON_DEMAND, 100 * MB) for m in "abc"}, 250 * MB)
    for name, pid in (("a", 11), ("b", 12), ("c", 13)):
        h.workers[name].pid = pid
        h.probe.rss[pid] = 60 * MB  # each really takes 60 MB, not the 100 MB estimated
    for name in "abc":
        (await h.hold(name)).release()
    assert all(h.state(m) is ModelState.READY for m in "abc")  # 3 x 60 MB fit in 250 MB: no eviction
    described = h.residency.describe(h.d("a"))["memory"][HOST]
    assert described == {"estimated_bytes": 100 * MB, "measured_bytes": 60 * MB}
    assert h.sample("voltgate:model_memory_bytes", model="a", pool="host", kind="measured") == 60 * MB


async def test_live_free_memory_is_respected_beside_the_budget() -> None:
    h = Harness({m: (ON_DEMAND, 100 * MB) for m in "ab"}, 1000 * MB)
    (await h.hold("a")).release()
    h.probe.available = 50 * MB  # something outside the gateway took the host's memory
    (await h.hold("b")).release()  # evicting a (100 MB) makes 150 MB available: enough
    assert h.state("a") is ModelState.UNLOADED and h.state("b") is ModelState.READY
