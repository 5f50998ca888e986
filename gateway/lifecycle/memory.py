"""Memory as the residency manager sees it: pools with budgets, what each model needs in them (estimated by
placement, then measured), and the probes that measure (NVML on GPUs, /proc on the host).

Pools are named `host` (RAM) and `gpu<index>`. A pool's budget is what placement planned with: the host's
`server.memory_budget_bytes` (default 80 % of MemAvailable at start), a GPU's free memory at start less the
1 GiB margin. A pool may also have a live reading (MemAvailable now, NVML's free memory now less the margin):
a load must fit both, so memory taken by something the gateway does not know about is respected too.

On a cluster (`voltgate serve --cluster`) every host has its own pools, named `<host>:host` and
`<host>:gpu<i>`: budgets from that host's inventory and the budget its plan used, live readings and the
measured use of each worker from that host's agent (`ReportedProbe`, fed by `gateway.cluster.serve`). A
model's memory names its host (`ModelMemory.host`), so a load on host B is weighed against B's pools only and
only models on B are evicted for it.

What a model takes is measured once it is READY: on a GPU, NVML's used memory after the load minus before
(loads run one at a time, so the difference is that model's); on the host, the resident set (VmRSS) of the
worker's process group. A measurement, once there is one, replaces the estimate in every later decision.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.placement.estimate import MARGIN_BYTES, MemoryEstimate
from gateway.placement.inventory import GIB, Inventory, host_available_bytes, host_budget_bytes

log = logging.getLogger("voltgate.residency")

HOST = "host"


def gpu_pool(index: int) -> str:
    return f"gpu{index}"


def on_host(host: str | None, pool: str) -> str:
    """A pool's name on a cluster host (`b:gpu0`); unchanged on the gateway's own host (`host` None)."""
    return pool if host is None else f"{host}:{pool}"


def split_pool(pool: str) -> tuple[str | None, str]:
    """`b:gpu0` -> ("b", "gpu0"); `gpu0` -> (None, "gpu0")."""
    host, _, local = pool.rpartition(":")
    return host or None, local


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def pool_label(pool: str, *, short: bool = False) -> str:
    """`host memory` / `GPU 0` (`host` / `GPU 0` when short), with `on host b` for a cluster host's pool."""
    host, local = split_pool(pool)
    label = ("host" if short else "host memory") if local == HOST else f"GPU {local.removeprefix('gpu')}"
    return label if host is None else f"{label} on host {host!r}"


class MemoryProbe(Protocol):
    """Live memory readings; None where there is nothing to read (no NVML, no /proc)."""

    def gpu_used_bytes(self, index: int) -> int | None: ...

    def gpu_free_bytes(self, index: int) -> int | None: ...

    def host_available_bytes(self) -> int | None: ...

    def group_rss_bytes(self, pgid: int) -> int | None:
        """Resident memory of every process in the process group `pgid` (a worker and what it spawned)."""
        ...


class NoProbe:
    """No live readings at all (in-process tests, or a host whose memory should only be budgeted)."""

    def gpu_used_bytes(self, index: int) -> int | None:
        del index
        return None

    def gpu_free_bytes(self, index: int) -> int | None:
        del index
        return None

    def host_available_bytes(self) -> int | None:
        return None

    def group_rss_bytes(self, pgid: int) -> int | None:
        del pgid
        return None


class SystemProbe:
    """NVML for GPUs (only when placement read them from NVML: a simulated layout has nothing to read) and
    /proc for the host. Every failure reads as None, never as an error."""

    def __init__(self, *, gpus: bool) -> None:
        self._nvml: Any = None
        if gpus:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception:  # no driver or library: no live GPU readings
                self._nvml = None

    def _memory(self, index: int) -> Any:
        if self._nvml is None:
            return None
        try:
            return self._nvml.nvmlDeviceGetMemoryInfo(self._nvml.nvmlDeviceGetHandleByIndex(index))
        except Exception:  # a GPU that cannot be read is treated as unknown
            return None

    def gpu_used_bytes(self, index: int) -> int | None:
        memory = self._memory(index)
        return int(memory.used) if memory is not None else None

    def gpu_free_bytes(self, index: int) -> int | None:
        memory = self._memory(index)
        return int(memory.free) if memory is not None else None

    def host_available_bytes(self) -> int | None:
        return host_available_bytes()

    def group_rss_bytes(self, pgid: int) -> int | None:
        total, found = 0, False
        with contextlib.suppress(OSError):
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                rss = _rss_in_group(int(entry.name), pgid)
                if rss is not None:
                    total, found = total + rss, True
        return total if found else None


def _rss_in_group(pid: int, pgid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the command name may hold spaces and ')'
        if int(fields[2]) != pgid:  # fields after the name: state, ppid, pgrp, ...
            return None
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class ModelMemory:
    """What one model takes, per pool: placement's estimate and, once it has been loaded, the measurement."""

    estimated: dict[str, int] = field(default_factory=dict)
    measured: dict[str, int] = field(default_factory=dict)
    host: str | None = None  # the cluster host it runs on (its pools are that host's); None: this one

    @classmethod
    def from_estimate(cls, estimate: MemoryEstimate | None, host: str | None = None) -> ModelMemory:
        if estimate is None:
            return cls(host=host)
        pools = {on_host(host, gpu_pool(i)): n for i, n in estimate.gpu_bytes.items() if n}
        if estimate.host_bytes:
            pools[on_host(host, HOST)] = estimate.host_bytes
        return cls(estimated=pools, host=host)

    @property
    def gpu_indices(self) -> list[int]:
        locals_ = (split_pool(p)[1] for p in self.estimated)
        return sorted(int(p.removeprefix("gpu")) for p in locals_ if p != HOST)

    def need(self) -> dict[str, int]:
        """Per pool: the measurement where there is one, else the estimate."""
        pools = {*self.estimated, *self.measured}
        return {pool: self.measured.get(pool, self.estimated.get(pool, 0)) for pool in pools}

    def source(self, pool: str) -> str:
        return "measured" if pool in self.measured else "estimated"

    def describe(self) -> str:
        """`host 0.19 GiB measured, GPU 0 9.34 GiB estimated`."""
        need = self.need()
        parts = [f"{pool_label(p, short=True)} {gib(n)} {self.source(p)}" for p, n in sorted(need.items())]
        return ", ".join(parts) or "nothing known"


class ReportedProbe:
    """A cluster host's readings as its agent last reported them (`gateway.cluster.serve` pushes them):
    MemAvailable and each GPU's used / free memory there, and each worker's VmRSS and GPU memory (NVML's
    per-process figure) by its pid on that host. What was never reported reads as None."""

    def __init__(self) -> None:
        self.available: int | None = None
        self.gpus: dict[int, tuple[int, int]] = {}  # index -> (used, free) bytes
        self.workers: dict[int, tuple[int | None, dict[int, int]]] = {}  # pid -> (rss, GPU index -> bytes)

    def update_host(self, available: int | None, gpus: Mapping[int, tuple[int, int]]) -> None:
        self.available, self.gpus = available, dict(gpus)

    def update_worker(self, pid: int | None, rss: int | None, gpu_bytes: Mapping[int, int]) -> None:
        if pid is not None:
            self.workers[pid] = (rss, dict(gpu_bytes))

    def gpu_used_bytes(self, index: int) -> int | None:
        return self.gpus[index][0] if index in self.gpus else None

    def gpu_free_bytes(self, index: int) -> int | None:
        return self.gpus[index][1] if index in self.gpus else None

    def host_available_bytes(self) -> int | None:
        return self.available

    def group_rss_bytes(self, pgid: int) -> int | None:
        return self.workers.get(pgid, (None, {}))[0]

    def worker_gpu_bytes(self, pid: int) -> dict[int, int]:
        return self.workers.get(pid, (None, {}))[1]


@dataclass
class Pools:
    """Budgets per pool (None: unbounded) and the live probe; on a cluster, each host's probe by host."""

    budgets: dict[str, int | None]
    probe: MemoryProbe
    live_gpus: bool = False
    hosts: dict[str, MemoryProbe] = field(default_factory=dict)  # cluster host -> its probe
    live_hosts: set[str] = field(default_factory=set)  # cluster hosts whose GPUs NVML reads

    @classmethod
    def from_inventory(cls, inventory: Inventory | None, host_budget: int | None, probe: MemoryProbe | None) -> Pools:
        budgets: dict[str, int | None] = {HOST: host_budget_bytes(host_budget)}
        for gpu in inventory.gpus if inventory is not None else ():
            budgets[gpu_pool(gpu.index)] = max(0, gpu.free_bytes - MARGIN_BYTES)
        live = inventory is not None and inventory.source == "nvml"
        return cls(budgets, probe if probe is not None else SystemProbe(gpus=live), live_gpus=live)

    def add_host(self, host: str, inventory: Inventory, budget: int | None, probe: MemoryProbe) -> None:
        """A cluster host's pools: `<host>:host` (the budget its plan used) and `<host>:gpu<i>` (free at its
        inventory less the margin), read live through `probe`. Replaces what that host had."""
        self.drop_host(host)
        self.budgets[on_host(host, HOST)] = budget
        for gpu in inventory.gpus:
            self.budgets[on_host(host, gpu_pool(gpu.index))] = max(0, gpu.free_bytes - MARGIN_BYTES)
        self.hosts[host] = probe
        if inventory.source == "nvml":
            self.live_hosts.add(host)
        else:
            self.live_hosts.discard(host)

    def drop_host(self, host: str) -> None:
        """A lost host's pools go (its models were moved or refused); it gets them again when it joins."""
        self.budgets = {p: b for p, b in self.budgets.items() if split_pool(p)[0] != host}
        self.hosts.pop(host, None)
        self.live_hosts.discard(host)

    def _probe(self, host: str | None) -> tuple[MemoryProbe, bool]:
        """The probe of `host` (None: the gateway's) and whether its GPUs can be read live."""
        if host is None:
            return self.probe, self.live_gpus
        return self.hosts.get(host, NoProbe()), host in self.live_hosts

    def summary(self, resident: list[ModelMemory]) -> dict[str, dict[str, int | None]]:
        """Per pool: the budget, what `resident` holds (measured or estimated), what is free, live free."""
        out: dict[str, dict[str, int | None]] = {}
        for pool, budget in sorted(self.budgets.items()):
            held = sum(m.need().get(pool, 0) for m in resident)
            out[pool] = {
                "budget_bytes": budget,
                "held_bytes": held,
                "free_bytes": None if budget is None else budget - held,
                "live_free_bytes": self.live_free(pool),
            }
        return out

    def live_free(self, pool: str) -> int | None:
        """Free memory in the pool right now (a GPU's less the margin), or None where it cannot be read."""
        host, local = split_pool(pool)
        probe, live_gpus = self._probe(host)
        if local == HOST:
            return probe.host_available_bytes()
        if not live_gpus:
            return None
        free = probe.gpu_free_bytes(int(local.removeprefix("gpu")))
        return None if free is None else max(0, free - MARGIN_BYTES)

    def gpu_used(self, indices: list[int], host: str | None = None) -> dict[int, int]:
        probe, live_gpus = self._probe(host)
        if not live_gpus:
            return {}
        used = {i: probe.gpu_used_bytes(i) for i in indices}
        return {i: n for i, n in used.items() if n is not None}

    def measure(self, memory: ModelMemory, pid: int | None, gpu_before: dict[int, int] | None = None) -> None:
        """Record what a READY worker really takes: on each GPU read before its load (`gpu_before`), NVML's
        used memory now minus then; on the host, its process group's VmRSS (the largest seen so far). On a
        cluster host, what its agent reported for that worker (NVML's per-process GPU memory, VmRSS)."""
        probe, _ = self._probe(memory.host)
        if isinstance(probe, ReportedProbe):
            for index, n in (probe.worker_gpu_bytes(pid) if pid is not None else {}).items():
                memory.measured[on_host(memory.host, gpu_pool(index))] = n
        elif gpu_before:
            for index, used in self.gpu_used(list(gpu_before)).items():
                memory.measured[gpu_pool(index)] = max(0, used - gpu_before[index])
        rss = probe.group_rss_bytes(pid) if pid is not None else None
        pool = on_host(memory.host, HOST)
        if rss is not None:
            memory.measured[pool] = max(rss, memory.measured.get(pool, 0))


def cluster_memory(placement: Mapping[str, Any]) -> tuple[Pools, dict[str, ModelMemory]]:
    """The pools of every host and each model's memory estimate (on its host's pools) from a cluster
    placement's JSON (`gateway.cluster.serve.ClusterServing.placement`). Probes read nothing until the cluster
    side attaches its own (`Pools.add_host`)."""
    pools = Pools({}, NoProbe())
    for entry in placement.get("hosts") or ():
        inventory = Inventory.model_validate(entry["report"]["inventory"])
        pools.add_host(str(entry["host"]), inventory, entry.get("memory_budget_bytes"), ReportedProbe())
    memory: dict[str, ModelMemory] = {}
    for decision in placement.get("decisions") or ():
        inner = decision.get("decision") or {}
        raw, host = inner.get("estimate"), decision.get("host")
        if isinstance(raw, dict) and inner.get("plan") is not None and host is not None:
            estimate = MemoryEstimate.model_validate({k: v for k, v in raw.items() if k != "terms_gib"})
            memory[str(decision["model"])] = ModelMemory.from_estimate(estimate, str(host))
    return pools, memory


def estimates_from_placement(placement: Mapping[str, Any]) -> tuple[Inventory | None, dict[str, MemoryEstimate]]:
    """The inventory and each model's memory estimate from a placement report's JSON (as `/v1/placement`
    serves it); both absent when the app was built without one."""
    inventory = None
    if isinstance(placement.get("inventory"), dict):
        inventory = Inventory.model_validate(placement["inventory"])
    estimates: dict[str, MemoryEstimate] = {}
    for decision in placement.get("decisions") or ():
        raw = decision.get("estimate") if isinstance(decision, dict) else None
        if isinstance(raw, dict) and decision.get("plan") is not None:
            fields = {k: v for k, v in raw.items() if k != "terms_gib"}  # computed on output only
            estimates[str(decision["model"])] = MemoryEstimate.model_validate(fields)
    return inventory, estimates
