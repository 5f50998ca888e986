"""The host agent interface: what the gateway asks of each host, whatever carries the call.

One agent runs per host. `gateway.cluster.ray_agent` carries the calls over Ray (an actor pinned to its host
by the custom resource `voltgate_host:<name>`); a plain HTTP agent could implement the same `HostAgent`
Protocol later. Every type that crosses it is a pydantic model, so any transport can carry it as JSON.

Semantics, per method:
* `describe()` answers the host's inventory (NVML, or the simulated layout it was started with), which of the
  given model files exist there, and every worker it runs with the memory that worker really uses.
* `start_worker()` starts (or keeps) the worker of `plan` with the supervision rules of a local one
  (`gateway.lifecycle.supervisor.WorkerMachine` over a `WorkerProcess`: backoff, crash limit) and waits up
  to `wait_s` for READY; it returns the worker's report either way. Starting a model already running with
  the same plan changes nothing.
* `worker()` is the health check: the worker's state as its supervisor on the host sees it (a worker that
  died is FAILED there, or STARTING again when restarts are on).
* `stop_worker()` stops it (SIGTERM to its group, grace, SIGKILL) and forgets it; unknown names are no error.
* A call on an agent whose host is gone raises `HostLost` (within a few seconds on Ray).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from backends.base import DeploymentPlan
from gateway.lifecycle.workers import WorkerState
from gateway.placement.inventory import Inventory


class HostLost(Exception):
    """The host (or its agent) is gone: its workers are unreachable until it rejoins."""

    def __init__(self, host: str, detail: str) -> None:
        super().__init__(f"host {host!r} is lost: {detail}")
        self.host = host


class UnknownWorker(Exception):
    """The agent runs no worker of that name."""


class WorkerReport(BaseModel):
    """One worker on a host: its supervisor's state, where to reach it, and the memory it really uses."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    state: WorkerState
    url: str | None = Field(default=None, description="the root URL other hosts reach it at, while READY")
    pid: int | None = None
    restarts: int = 0
    last_error: str | None = None
    rss_bytes: int | None = Field(default=None, description="resident memory of its process group (VmRSS)")
    gpu_bytes: dict[int, int] = Field(default_factory=dict, description="NVML: GPU index -> bytes it holds")


class HostReport(BaseModel):
    """What a host agent answers to `describe()`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str
    address: str = Field(description="the address its workers bind and are reached at")
    inventory: Inventory
    files: dict[str, bool] = Field(default_factory=dict, description="each path asked about -> exists here")
    memory_available_bytes: int | None = Field(default=None, description="the host's MemAvailable now")
    workers: list[WorkerReport] = Field(default_factory=list)


class HostAgent(Protocol):
    """One host's agent, as the gateway calls it; see the module docstring for the semantics."""

    host: str

    async def describe(self, paths: Sequence[str] = ()) -> HostReport: ...

    async def start_worker(self, plan: DeploymentPlan, token: str, wait_s: float = 600.0) -> WorkerReport: ...

    async def worker(self, name: str) -> WorkerReport: ...

    async def stop_worker(self, name: str, grace_s: float = 10.0) -> None: ...
