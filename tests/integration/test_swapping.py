"""The residency manager over real worker processes (`tests/fakes/fake_worker.py` under `WorkerMachine`):
memory measured from the process group's VmRSS, evictions that really end the process group, a failed
start reported with the worker's last log lines and not retried in a loop."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import httpx
import pytest

from backends.base import DeploymentPlan, EngineName, LaunchSpec
from backends.llamacpp import LlamaCppAdapter
from gateway.admission import Admission
from gateway.config import ServerSettings
from gateway.errors import GatewayError
from gateway.lifecycle.deployments import Deployment, Registry
from gateway.lifecycle.memory import HOST, ModelMemory, Pools, SystemProbe
from gateway.lifecycle.residency import Residency
from gateway.lifecycle.workers import Status as ModelState
from gateway.ops.metrics import Metrics
from tests.conftest import REPO
from tests.integration.test_supervisor import supervised

pytestmark = pytest.mark.integration
MIB = 1 << 20


def fake(*flags: str):
    def spec(port: int) -> LaunchSpec:
        return LaunchSpec(
            argv=(sys.executable, "-m", "tests.fakes.fake_worker", "--port", str(port), *flags),
            env={"PYTHONPATH": str(REPO)},
            startup_timeout_s=30,
        )

    return spec


class Gateway:
    """A registry of on-demand fake workers, each estimated at 8 MiB, under a host budget."""

    def __init__(self, client: httpx.AsyncClient, workers: dict[str, tuple[str, ...]], budget: int) -> None:
        self.metrics = Metrics(gpu=False)
        self.registry = Registry()
        memory = {name: ModelMemory(estimated={HOST: 8 * MIB}) for name in workers}
        pools = Pools({HOST: budget}, SystemProbe(gpus=False))
        self.residency = Residency(self.registry, ServerSettings(startup_timeout_s=30), self.metrics, pools, memory)
        for name, flags in workers.items():
            worker = supervised(name, fake(*flags), client=client, restarts=False,
                                   on_state=self.residency.on_worker_state)  # fmt: skip
            plan = DeploymentPlan(model=name, engine=EngineName.LLAMACPP, source_path=Path("/m.gguf"),
                                  model_format="gguf", context_tokens=512)  # fmt: skip
            self.registry.add(Deployment(name, (), plan, LlamaCppAdapter(), worker, Admission(name, 1, 4, 5),
                                         load="on_demand"))  # fmt: skip

    def d(self, name: str) -> Deployment:
        return self.registry.resolve(name)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_memory_is_measured_from_the_worker_and_an_eviction_ends_its_process_group() -> None:
    async with httpx.AsyncClient() as client:
        gw = Gateway(client, {"a": ("--hold-mib", "96"), "b": ("--hold-mib", "16")}, budget=160 * MIB)
        try:
            (await gw.residency.ensure_loaded(gw.d("a"))).release()
            pid = gw.d("a").worker.pid
            assert pid is not None
            measured = gw.residency.describe(gw.d("a"))["memory"][HOST]["measured_bytes"]
            assert measured > 96 * MIB  # its VmRSS, far above the 8 MiB estimate
            (await gw.residency.ensure_loaded(gw.d("b"))).release()  # 8 MiB estimated fits beside a (measured)
            assert gw.residency.state(gw.d("a")) is ModelState.READY
            b_measured = gw.residency.describe(gw.d("b"))["memory"][HOST]["measured_bytes"]
            assert measured + b_measured > 160 * MIB  # the estimate was wrong; the next decision knows better
            await gw.residency.unload(gw.d("b"))
            hold = await gw.residency.ensure_loaded(gw.d("b"))  # measured now: a must go to make room
            hold.release()
            assert gw.residency.state(gw.d("a")) is ModelState.UNLOADED
            assert not group_alive(pid)
            response = await client.post(gw.d("b").worker.base_url() + "/v1/chat/completions", json={"model": "b"})
            assert response.status_code == 200
        finally:
            await gw.residency.close()


async def test_a_failed_start_is_reported_with_its_log_and_not_retried_in_a_loop() -> None:
    async with httpx.AsyncClient() as client:
        gw = Gateway(client, {"bad": ("--exit-at-start", "1")}, budget=1 << 30)
        try:
            results = await asyncio.gather(
                *(gw.residency.ensure_loaded(gw.d("bad")) for _ in range(3)), return_exceptions=True
            )
            for result in results:
                assert isinstance(result, GatewayError), result
                assert "failed to load" in result.message and "exited with code 1 during start" in result.message
                assert "failed to load model (simulated)" in result.message  # the worker's own last log line
            worker = gw.d("bad").worker
            await asyncio.sleep(1.5)
            assert worker.pid is None and worker.restarts == 0  # no restart loop behind the gateway's back
            assert gw.residency.state(gw.d("bad")) is ModelState.FAILED
        finally:
            await gw.residency.close()


async def test_concurrent_ensure_ready_calls_join_one_start_and_a_stopped_worker_starts_again() -> None:
    async with httpx.AsyncClient() as client:
        worker = supervised("m", fake("--ready-after", "0.5"), client=client, restarts=False)
        try:
            await asyncio.gather(*(worker.ensure_ready(20) for _ in range(5)))
            first = worker.pid
            await worker.stop()
            await worker.ensure_ready(20)
            assert worker.pid is not None and worker.pid != first
        finally:
            await worker.stop()
