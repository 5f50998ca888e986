"""The host agent's work, on its host: inventory, model files, and the workers it supervises there.

`LocalHostAgent` implements `gateway.cluster.agent.HostAgent` in-process; the Ray actor
(`gateway.cluster.ray_agent`) holds one and forwards each call to it. Workers are the gateway's own
`WorkerMachine` over a `WorkerProcess` handle (the same launch, health check, backoff and crash limit as a pinned
worker on the gateway's host), started
from the engine adapter's launch spec rewritten by `remote_launch_spec` to bind `bind_host` and require the
launch token; their health checks send that token.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from backends.base import DeploymentPlan, EngineAdapter, EngineName
from backends.llamacpp.adapter import LlamaCppAdapter
from backends.lmdeploy import LMDeployAdapter
from gateway.cluster.access import auth_headers, remote_launch_spec
from gateway.cluster.agent import HostReport, UnknownWorker, WorkerReport
from gateway.lifecycle.memory import SystemProbe
from gateway.lifecycle.policy import PINNED
from gateway.lifecycle.process import WorkerProcess
from gateway.lifecycle.supervisor import WorkerMachine
from gateway.lifecycle.workers import WorkerStartError, WorkerState
from gateway.placement.inventory import Inventory, host_available_bytes, inventory_from_spec

_ANY_ADDRESS = ("0.0.0.0", "::", "")


@dataclass
class _Running:
    plan: DeploymentPlan
    process: WorkerMachine
    client: httpx.AsyncClient


class LocalHostAgent:
    """A host's agent running on that host. All methods run on one event loop (the Ray actor's)."""

    def __init__(
        self,
        host: str,
        *,
        bind_host: str,
        advertise: str | None = None,
        gpus: str = "auto",
        adapters: Mapping[EngineName, EngineAdapter] | None = None,
    ) -> None:
        """`bind_host` is the interface workers listen on (the operator names it); `advertise` the address
        other hosts reach them at (default `bind_host`; needed when binding every interface); `gpus` is
        `auto` (NVML) or a simulated layout."""
        if bind_host in _ANY_ADDRESS and not advertise:
            raise ValueError("a worker bound to every interface needs the address other hosts reach it at")
        self.host = host
        self._bind_host = bind_host
        self._advertise = advertise or bind_host
        self._gpus = gpus
        self._adapters: dict[EngineName, EngineAdapter] = dict(
            adapters or {EngineName.LLAMACPP: LlamaCppAdapter(), EngineName.LMDEPLOY: LMDeployAdapter()}
        )
        self._workers: dict[str, _Running] = {}
        nvml = gpus.strip().lower() == "auto"
        self._probe = SystemProbe(gpus=nvml)
        self._nvml: Any = _nvml() if nvml else None

    async def describe(self, paths: Sequence[str] = ()) -> HostReport:
        inventory: Inventory = inventory_from_spec(self._gpus)
        return HostReport(
            host=self.host,
            address=self._advertise,
            inventory=inventory,
            files=await asyncio.to_thread(_existing, paths),
            memory_available_bytes=host_available_bytes(),
            workers=[self._report(name) for name in sorted(self._workers)],
        )

    async def start_worker(self, plan: DeploymentPlan, token: str, wait_s: float = 600.0) -> WorkerReport:
        running = self._workers.get(plan.model)
        if running is not None and running.plan != plan:
            await self.stop_worker(plan.model)
            running = None
        if running is None:
            problem = self._cannot_launch(plan)
            if problem is not None:
                return WorkerReport(name=plan.model, state=WorkerState.FAILED, last_error=problem)
            running = self._launch(plan, token)
            self._workers[plan.model] = running
        with contextlib.suppress(WorkerStartError):
            await running.process.ensure_ready(wait_s)
        return self._report(plan.model)

    async def worker(self, name: str) -> WorkerReport:
        if name not in self._workers:
            raise UnknownWorker(f"host {self.host!r} runs no worker {name!r}")
        return self._report(name)

    async def stop_worker(self, name: str, grace_s: float = 10.0) -> None:
        running = self._workers.pop(name, None)
        if running is None:
            return
        try:
            await running.process.stop(grace_s)
        finally:
            await running.client.aclose()

    async def close(self) -> None:
        """Stop every worker (the agent is going away)."""
        for name in list(self._workers):
            await self.stop_worker(name, grace_s=5.0)

    def _cannot_launch(self, plan: DeploymentPlan) -> str | None:
        """Why this host cannot start `plan`'s worker at all (no adapter, engine not installed), or None."""
        adapter = self._adapters.get(plan.engine)
        if adapter is None:
            return f"host {self.host!r} cannot start {plan.engine.value} workers"
        try:
            adapter.launch_spec(plan, 0)  # a dry run: an engine missing on this host is named here, not in a loop
        except Exception as exc:  # LMDeployNotInstalled and the like: whatever stops the launch, in its words
            return f"host {self.host!r} cannot start {plan.model!r}: {exc}"
        return None

    def _launch(self, plan: DeploymentPlan, token: str) -> _Running:
        adapter = self._adapters[plan.engine]
        client = httpx.AsyncClient(headers=auth_headers(token), timeout=httpx.Timeout(10.0))
        handle = WorkerProcess(
            plan.model,
            lambda port: remote_launch_spec(adapter.launch_spec(plan, port), self._bind_host, token),
            client=client,
            host=self._advertise,
        )
        return _Running(plan, WorkerMachine(handle, PINNED), client)  # restarts like a pinned local worker

    def _report(self, name: str) -> WorkerReport:
        running = self._workers[name]
        process = running.process
        port = running.process.handle.port if isinstance(running.process.handle, WorkerProcess) else None
        ready = process.state is WorkerState.READY and port is not None
        pid = process.pid if process.state in (WorkerState.STARTING, WorkerState.READY) else None
        return WorkerReport(
            name=name,
            state=process.state,
            url=f"http://{self._advertise}:{port}" if ready else None,
            pid=pid,
            restarts=process.restarts,
            last_error=process.last_error,
            rss_bytes=self._probe.group_rss_bytes(pid) if pid else None,
            gpu_bytes=self._gpu_bytes(pid) if pid else {},
        )

    def _gpu_bytes(self, pid: int) -> dict[int, int]:
        """NVML's per-process memory of `pid` on each GPU (empty without NVML, or for a simulated layout)."""
        nvml, found = self._nvml, dict[int, int]()
        if nvml is None:
            return {}
        with contextlib.suppress(Exception):  # a GPU NVML cannot read counts as holding nothing known
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if proc.pid == pid and proc.usedGpuMemory:
                        found[index] = found.get(index, 0) + int(proc.usedGpuMemory)
        return found


def _existing(paths: Sequence[str]) -> dict[str, bool]:
    return {path: os.path.exists(path) for path in paths}


def _nvml() -> Any:
    """pynvml, initialised, or None without a driver or library (a simulated layout never asks)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver, no library: no per-process GPU readings
        return None
    return pynvml
